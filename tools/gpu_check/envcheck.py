"""Step a of the GPU check: versions and imports (run from the project root with the check's
PYTHONPATH): python, torch and CUDA, the GPU, every package Chorus imports, espeak-ng's library,
Chorus's own modules, and which of Ray's optional parts import."""

import ctypes
import importlib
import os
import sys
import time

PACKAGES = ["ray", "pydantic", "pydantic_core", "jiwer", "rapidfuzz", "soundfile", "espeakng_loader",
            "flashlight.lib.text", "click", "numpy", "yaml", "google.protobuf", "msgpack", "packaging", "jsonschema",
            "sentencepiece", "matplotlib", "tqdm", "pyarrow", "requests", "filelock", "typing_extensions", "aiohttp",
            "grpc", "psutil"]
CHORUS = ["orchestrator.cli", "jobs.workload", "jobs.synth.corpus", "jobs.decode", "orchestrator.learner.service",
          "orchestrator.driver.job",
          "ray.util.metrics", "ray.util.placement_group"]


def main() -> None:
    started = time.time()
    import torch
    import torchaudio

    print(f"python={sys.version.split()[0]} exe={sys.executable}")
    print(f"torch={torch.__version__} torchaudio={torchaudio.__version__} cuda_available={torch.cuda.is_available()} "
          f"cuda={torch.version.cuda} cudnn={torch.backends.cudnn.version()}")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        print(f"gpu={p.name} memory_gib={p.total_memory / 2**30:.1f} sms={p.multi_processor_count} "
              f"bf16={torch.cuda.is_bf16_supported()}")
    for name in PACKAGES:
        try:
            module = importlib.import_module(name)
            where = os.path.dirname(getattr(module, "__file__", "") or "?")
            print(f"{name}={getattr(module, '__version__', '?')} at {where}")
        except Exception as exc:
            print(f"{name}: IMPORT FAILED {type(exc).__name__}: {exc}")
    import espeakng_loader
    import soundfile

    print(f"libsndfile={soundfile.__libsndfile_version__}")
    ctypes.CDLL(espeakng_loader.get_library_path())
    print(f"espeak-ng lib={espeakng_loader.get_library_path()} data={espeakng_loader.get_data_path()}")
    for name in CHORUS:
        importlib.import_module(name)
    print(f"chorus imports ok ({', '.join(CHORUS)})")
    try:
        importlib.import_module("ray.train")
        importlib.import_module("ray.tune")
        print("ray.train, ray.tune import ok")
    except Exception as exc:
        print(f"ray.train/ray.tune: {type(exc).__name__}: {exc} (only chorus sweep needs them)")
    gone = [m for m in ("ray.rllib", "ray.serve", "ray.llm", "ray.data") if m in sys.modules]
    print(f"stripped ray parts imported: {gone or 'none'}; import time {time.time() - started:.1f}s")


if __name__ == "__main__":
    main()
