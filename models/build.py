"""Write the bundled sample models to models/ (deterministic: same onnx, same bytes).

Usage: python models/build.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx

from xbackend.model.samples import SAMPLES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    for name, sample in SAMPLES.items():
        path = out / f"{name}.onnx"
        onnx.save(sample.builder(), str(path))
        print(f"{path}  ({path.stat().st_size} bytes): {sample.known}")


if __name__ == "__main__":
    main()
