"""Local stand-ins for the datasets of tinker-cookbook 0.6.1's audio recipes, written by the tests, never downloaded
(docs/cookbook.md#audio-recipes).

Every clip is a synthetic WAV: one short tone per word of its transcript (the word's letters pick the pitch), with a
little seeded noise, so different transcripts are different sounds. Each writer lays its clips out the way its
recipe reads them:

- LibriSpeech (`asr/`): `openslr/librispeech_asr/` in the recipe's cwd, config `other`, splits `train.500` and
  `validation` as parquet, rows `{id, text, audio: {array, sampling_rate}}` (`write_librispeech_standin`).
- EkaCare (`medical_asr/`): `ekacare/eka-medical-asr-evaluation-dataset/`, config `en`, split `test`, rows
  `{audio, text, md5_audio, file_name, medical_entities}` where `medical_entities` is the JSON the recipe parses
  (`write_ekacare_standin`).
- Expresso (`emotion/`): the raw release as `prepare_data.py` reads it (`read_transcriptions.txt`,
  `splits/{train,dev,test}.txt`, `audio_48khz/read/<speaker>/<style>/base/<id>.wav` at 48 kHz / 24-bit), so the
  recipe's own prepare step makes the 16 kHz manifests (`write_expresso_raw_standin`); or those manifests
  directly (`{split}.jsonl` + `wav/`), for a machine without ffmpeg (`write_expresso_manifests_standin`).

The hub's LibriSpeech and EkaCare store audio as `Audio()` features, which `datasets` 5 decodes with torchcodec
(absent here): the stand-ins store the decoded form the recipes index (`audio["array"]`,
`audio["sampling_rate"]`), a struct column.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
WORD_SECONDS = 0.15

LIBRISPEECH_ID = "openslr/librispeech_asr"
EKACARE_ID = "ekacare/eka-medical-asr-evaluation-dataset"
EXPRESSO_STYLES = ("confused", "default", "enunciated", "happy", "laughing", "sad", "whisper")

SENTENCES = (
    "the cat sat", "a red boat", "open the door", "birds sing early", "cold water", "turn left now",
    "we met at noon", "blue sky", "read the book", "stop here", "light the lamp", "rain again",
)
MEDICAL_SENTENCES = (
    ("take paracetamol 500 mg twice daily", ["paracetamol 500 mg"]),
    ("start amoxicillin for five days", ["amoxicillin"]),
    ("patient has mild fever", ["mild fever"]),
    ("continue metformin after meals", ["metformin"]),
    ("advise rest and fluids", ["rest"]),
    ("review blood pressure in a week", ["blood pressure"]),
    ("give cetirizine at night", ["cetirizine"]),
    ("reduce salt intake", ["salt intake"]),
    ("apply the ointment daily", ["ointment"]),
    ("check sugar levels", ["sugar levels"]),
)


def synth_speech(text: str, sample_rate: int = SAMPLE_RATE, style: int = 0, seed: int = 0) -> np.ndarray:
    """A float32 clip in [-1, 1]: one tone per word (pitch from the word's letters, shifted by `style`), noise."""
    rng = np.random.default_rng(seed)
    parts = []
    for word in text.split():
        freq = 200.0 + 40.0 * (sum(map(ord, word)) % 40) + 60.0 * style
        t = np.arange(int(WORD_SECONDS * sample_rate)) / sample_rate
        parts.append(0.4 * np.sin(2 * np.pi * freq * t) * np.hanning(len(t)))
        parts.append(np.zeros(int(0.03 * sample_rate)))
    wave = np.concatenate(parts)
    return (wave + 0.01 * rng.standard_normal(len(wave))).astype(np.float32)


def _audio_rows(texts: Sequence[str], seed: int) -> list[dict]:
    return [{"array": synth_speech(text, seed=seed + i).tolist(), "sampling_rate": SAMPLE_RATE}
            for i, text in enumerate(texts)]


def _write_parquet(rows: dict[str, list], path: Path) -> None:
    import datasets

    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(rows).to_parquet(str(path))


def _readme(config: str, splits: dict[str, str]) -> str:
    """A dataset card whose `configs:` block maps `config`'s splits to files (docs/cookbook.md#datasets-offline)."""
    files = "".join(f"  - split: {split}\n    path: {path}\n" for split, path in splits.items())
    return f"---\nconfigs:\n- config_name: {config}\n  data_files:\n{files}---\n# stand-in, written by tx's tests\n"


def write_librispeech_standin(dataset_dir: Path, n_train: int, n_validation: int) -> None:
    """`openslr/librispeech_asr`, config `other`: `train.500` and `validation` splits of synthetic clips."""
    splits = {"train.500": n_train, "validation": n_validation}
    for k, (split, n) in enumerate(splits.items()):
        texts = [SENTENCES[(i + 5 * k) % len(SENTENCES)] for i in range(n)]
        rows = {"id": [f"{split}-{i:04d}" for i in range(n)], "text": [t.upper() for t in texts],
                "audio": _audio_rows(texts, seed=100 * k)}
        _write_parquet(rows, dataset_dir / "other" / f"{split}-00000-of-00001.parquet")
    (dataset_dir / "README.md").write_text(
        _readme("other", {s: f"other/{s}-*.parquet" for s in splits}), encoding="utf-8")


def write_ekacare_standin(dataset_dir: Path, n: int = len(MEDICAL_SENTENCES)) -> None:
    """`ekacare/eka-medical-asr-evaluation-dataset`, config `en`, split `test` (the recipe splits it 80/20)."""
    picked = [MEDICAL_SENTENCES[i % len(MEDICAL_SENTENCES)] for i in range(n)]
    audio = _audio_rows([text for text, _ in picked], seed=7)
    rows = {
        "audio": audio,
        "text": [text for text, _ in picked],
        "md5_audio": [hashlib.md5(f"{i}:{text}".encode()).hexdigest() for i, (text, _) in enumerate(picked)],
        "file_name": [f"clip_{i:04d}.wav" for i in range(n)],
        "medical_entities": [json.dumps([[e, "drugs", [[0, len(e)]]] for e in entities]) for _, entities in picked],
    }
    _write_parquet(rows, dataset_dir / "en" / "test-00000-of-00001.parquet")
    (dataset_dir / "README.md").write_text(_readme("en", {"test": "en/test-*.parquet"}), encoding="utf-8")


def _expresso_clips(per_split: dict[str, int]) -> dict[str, list[tuple[str, str, str]]]:
    """split -> [(clip id, style, transcript)]: styles in turn, sentences in turn (a sentence in several styles)."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    k = 0
    for split, n in per_split.items():
        out[split] = []
        for _ in range(n):
            style = EXPRESSO_STYLES[k % len(EXPRESSO_STYLES)]
            out[split].append((f"ex01_{style}_{k:05d}", style, SENTENCES[(k // 2) % len(SENTENCES)]))
            k += 1
    return out


def write_expresso_raw_standin(root: Path, per_split: dict[str, int]) -> Path:
    """The raw Expresso release's read "base" subset under `root/expresso` (48 kHz / 24-bit WAVs), which
    `prepare_data.py data_path=<root>` finds extracted (it skips the download) and transcodes. Returns it."""
    import soundfile as sf

    expresso = root / "expresso"
    clips = _expresso_clips(per_split)
    transcripts, k = [], 0
    (expresso / "splits").mkdir(parents=True, exist_ok=True)
    for split, rows in clips.items():
        (expresso / "splits" / f"{split}.txt").write_text("".join(f"{cid}\t0\t1\n" for cid, _, _ in rows))
        for cid, style, text in rows:
            path = expresso / "audio_48khz" / "read" / "ex01" / style / "base" / f"{cid}.wav"
            path.parent.mkdir(parents=True, exist_ok=True)
            wave = synth_speech(text, sample_rate=48_000, style=EXPRESSO_STYLES.index(style), seed=k)
            sf.write(str(path), wave, 48_000, subtype="PCM_24")
            transcripts.append(f"{cid}\t{text}\n")
            k += 1
    (expresso / "read_transcriptions.txt").write_text("".join(transcripts), encoding="utf-8")
    return expresso


def write_expresso_manifests_standin(data_dir: Path, per_split: dict[str, int]) -> Path:
    """What `prepare_data.py` writes (`<split>.jsonl` + `wav/` at 16 kHz), for the recipes' `data_dir`."""
    import soundfile as sf

    (data_dir / "wav").mkdir(parents=True, exist_ok=True)
    for k, (split, rows) in enumerate(_expresso_clips(per_split).items()):
        lines = []
        for i, (cid, style, text) in enumerate(rows):
            wave = synth_speech(text, style=EXPRESSO_STYLES.index(style), seed=100 * k + i)
            sf.write(str(data_dir / "wav" / f"{cid}.wav"), wave, SAMPLE_RATE, subtype="PCM_16")
            lines.append(json.dumps({"id": cid, "text": text, "emotion": style, "path": f"wav/{cid}.wav",
                                     "num_frames": len(wave), "sample_rate": SAMPLE_RATE}) + "\n")
        (data_dir / f"{split}.jsonl").write_text("".join(lines), encoding="utf-8")
    return data_dir
