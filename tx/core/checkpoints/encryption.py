"""age encryption of exported files (`save_weights_external(age_encryption_recipients=...)`).

Every file of the export is encrypted to all recipients (native `age1...` keys or SSH public keys)
and stored as `<name>.age`; the plaintext never stays on disk. Decrypt with `age -d -i KEY`.
"""

from __future__ import annotations

from pathlib import Path

import pyrage

from tx.types import UserError

MAX_RECIPIENTS = 10


def parse_recipients(recipients: list[str]) -> list[object]:
    """age or SSH recipients; UserError naming the first one that is neither."""
    if not recipients:
        raise UserError("age_encryption_recipients is empty; leave it out for an unencrypted export")
    if len(recipients) > MAX_RECIPIENTS:
        raise UserError(f"at most {MAX_RECIPIENTS} age_encryption_recipients, got {len(recipients)}")
    return [_parse(r) for r in recipients]


def _parse(recipient: str) -> object:
    text = recipient.strip()
    try:
        if text.startswith("age1"):
            return pyrage.x25519.Recipient.from_str(text)
        if text.startswith(("ssh-ed25519 ", "ssh-rsa ")):
            return pyrage.ssh.Recipient.from_str(text)
    except pyrage.RecipientError as exc:
        raise UserError(f"invalid age recipient {text[:40]!r}: {exc}") from exc
    raise UserError(f"invalid age recipient {text[:40]!r}: expected an 'age1...' key or an ssh-ed25519/ssh-rsa key")


def encrypt_tree(directory: Path, recipients: list[object]) -> None:
    """Replace every file under `directory` by its age encryption, named `<file>.age`."""
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        target = path.with_name(path.name + ".age")
        pyrage.encrypt_file(str(path), str(target), recipients)  # streams; the file is never all in memory
        path.unlink()
