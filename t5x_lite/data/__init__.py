"""Data: TFDS builders and `load_split` (builders.py), the SentencePiece vocabulary
(vocabulary.py), the NumPy input pipeline (pipeline.py), task formatting (tasks.py)."""
