"""nmt: sequence-to-sequence learning with sparse and structured probability mappings."""
import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

setup(
    name="nmt",
    version=re.search(r'__version__ = "([^"]+)"', (HERE / "nmt" / "_version.py").read_text()).group(1),
    description=(
        "Sequence-to-sequence toolkit with sparse and structured attention/output "
        "mappings, Fenchel-Young losses and certified beam search"
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    license_files=["LICENSE"],
    python_requires=">=3.10",
    packages=find_packages(include=["nmt", "nmt.*"]),
    # the native kernels, compiled on first use where a C compiler is (nmt/sparse/_native.py): the
    # mappings' and the search step's candidates, decoding's search bookkeeping, the LSTM cell, the dropout mask
    package_data={"nmt.sparse": ["_sorted_threshold.c", "_step_candidates.c", "_newton_threshold.c", "_power_threshold.c", "_taut_string.c", "_group_average.c",
                                 "_cross_entropy.c", "_cpu_dispatch.h", "_float_math.h", "_power_avx2.h"],
                  "nmt.translate": ["_step_update.c"],
                  "nmt.models": ["_lstm_cell.c", "_dropout_mask.c"]},
    install_requires=[
        "torch>=2.1",
        "numpy",
        "pyyaml>=6",
        "sentencepiece>=0.1.99",
        "subword-nmt>=0.3.8",
        "sacrebleu>=2.3",
        "tensorboard>=2.12",
        "tqdm>=4.60",
        "matplotlib>=3.6",
    ],
    extras_require={
        # Oracles (entmax, scipy) are used by tests and benchmarks only, never at run time.
        # triton: the fused CUDA kernels of nmt.sparse (optional); the tests run them on CPU in
        # the Triton interpreter, so CI installs it where wheels exist.
        "test": ["pytest>=7", "pytest-xdist>=3", "hypothesis>=6.80", "scipy>=1.10", "entmax>=1.1",
                 'triton>=3.0; platform_system == "Linux" and platform_machine == "x86_64"'],
        "triton": ['triton>=3.0; platform_system == "Linux"'],
    },
    entry_points={
        "console_scripts": [
            "nmt-train=nmt.cli.train:main",
            "nmt-translate=nmt.cli.translate:main",
            "nmt-average=nmt.cli.average:main",
            "nmt-release=nmt.cli.release:main",
            "nmt-server=nmt.cli.server:main",
        ]
    },
)
