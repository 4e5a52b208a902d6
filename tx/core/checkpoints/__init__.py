"""Checkpoints: tinker:// paths and their files on disk, written atomically (`files.py`); the saves a run
makes (`writer.py`); listing, TTLs, publishing, deletion and who may read what (`catalog.py`); signed
download links (`downloads.py`); age encryption of exported adapters (`encryption.py`)."""
