"""Chorus's runtime. `from orchestrator import Recognizer` gives a trained model to use
(`orchestrator.checkpoint.trained`); importing this package loads nothing else."""


def __getattr__(name: str):
    if name == "Recognizer":
        from orchestrator.checkpoint.trained import Recognizer

        return Recognizer
    raise AttributeError(f"module 'orchestrator' has no attribute {name!r}")
