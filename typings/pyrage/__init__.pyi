# Type stubs for the parts of pyrage (a Rust extension that ships none) that tx/core/encryption.py uses.
from collections.abc import Sequence

from . import ssh as ssh, x25519 as x25519

class RecipientError(Exception): ...

def encrypt_file(infile: str, outfile: str, recipients: Sequence[object], armored: bool = False) -> None: ...
