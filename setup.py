"""jaxwebrl: asynchronous multi-step RL for visual web agents, in JAX.

Install for development and tests:  pip install -e ".[test]"
(torch, the test-time reference, comes from the CPU wheel: pip install torch==2.13.0)
Extras: ".[qwen]" the real Qwen vocabulary (BPE ranks from the dashscope wheel, built into a tokenizer.json offline);
".[tpu]" libtpu, to compile for TPU topologies ahead of time on any machine (launch/compile.py), and to run on one;
".[gpu]" JAX's CUDA 12 plugin, to run on NVIDIA GPUs.
"""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    "jax[cpu]==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    "tensorstore==0.1.86",
    "ml-collections==1.1.0",
    "absl-py==2.5.1",
    "numpy>=2.0,<3",
    "ml-dtypes==0.6.0",   # JAX's and TensorStore's dtypes: 0.7.0's import costs every process ~0.6 CPU-s more
                          # (bench/process_cost.py; docs/results/house/process_cost.json)
    "pillow==13.0.0",
    "tokenizers==0.23.3",
    "jinja2>=3.1.6",
    "selenium==4.51.0",
    "miniwob==1.1.0",
    "pyzmq==27.3.0",
    "tensorboardX==2.6.5",
    "rich==15.0.0",
    "psutil==7.2.2",
]

QWEN_VOCAB = ["dashscope==1.25.24"]   # ships qwen.tiktoken (jaxwebrl/models/qwen_vocab.py)
TPU = ["jax[tpu]==0.10.2"]             # libtpu: AOT compilation for TPU topologies (launch/compile.py)
GPU = ["jax[cuda12]==0.10.2"]          # JAX's CUDA 12 plugin (cuDNN, NCCL) at the pinned JAX, for NVIDIA GPUs

EXTRAS = {
    "test": QWEN_VOCAB + [
        "pytest==9.0.3",
        "pytest-timeout==2.4.0",
        "pytest-xdist==3.8.0",      # .ci/test: two workers (-n 2) over the suite
        "hypothesis==6.155.2",
        "torch==2.13.0",
        "transformers==5.24.0",
        "nbclient==0.11.0",
        "nbformat==5.11.1",
        "ipykernel==7.4.0",
        "matplotlib==3.11.2",
        "ray==2.60.0",
        "cryptography==48.0.0",     # tests/env/test_judge_tls.py: a self-signed HTTPS judge (also dashscope's)
        "regex==2026.5.9",          # tests/models/test_char_dfa.py: partial matching, the grammar's reference
    ],
    "notebooks": ["matplotlib==3.11.2", "nbclient==0.11.0", "nbformat==5.11.1", "ipykernel==7.4.0"],
    "ray": ["ray==2.60.0"],
    "qwen": QWEN_VOCAB,
    "tpu": TPU,
    "gpu": GPU,
}

setup(
    name="jaxwebrl",
    version="0.1.0",
    description="Fully asynchronous multi-step RL for visual web agents in JAX/Flax",
    packages=find_packages(include=["jaxwebrl", "jaxwebrl.*", "configs"]),   # configs: recipes import configs.base
    package_data={"jaxwebrl.env.tasks.chain": ["pages/*.html"],                     # the chain task's page
                  "jaxwebrl.env.tasks.sites": ["tasks.jsonl", "pages/*/*.html"]},   # the bundled offline sites
    python_requires=">=3.10",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
