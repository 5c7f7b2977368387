# kafka-scorer worker image.
#
# CPU build (default):   docker build -t kafka-scorer:cpu .
# NVIDIA GPU build:      docker build -t kafka-scorer:cuda \
#                          --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 .
# The CUDA torch wheels bring their own CUDA runtime, so the slim base image is enough on a host with
# the NVIDIA driver and the NVIDIA Container Toolkit; the CPU wheels keep the image ~1 GB smaller.
# Pin torch with --build-arg TORCH_VERSION=2.11.0, the oldest the project supports (empty: newest on
# that index; by default the version constraints/lock.txt pins, when the lock is there).
# The base image is an argument so `./dev image-check` can build on a stand-in made from Debian's
# packages where no image registry is reachable (devtools/image_check.py); users keep the default.

ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/home/scorer/.cache/huggingface

# The cache directory exists in the image, owned by the user, so a named volume mounted there
# (compose's hf-cache) starts with the right owner instead of root.
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin scorer \
    && mkdir -p /home/scorer/.cache/huggingface \
    && chown -R scorer:scorer /home/scorer/.cache

# A C/C++ compiler: Triton builds its kernel launchers with the host's C compiler at run time (on CUDA:
# FlexAttention, the compiled decoder layers, the label kernels), and torch.compile's CPU code needs g++
# (decoder_forward=compiled). Without one the worker still serves, slower: its warm-up falls back to
# cascade, eager layers and torch's label scores, one WARNING line each. About 200 MB; a CPU image on
# the default eager layers can leave it out with --build-arg COMPILERS=
ARG COMPILERS="gcc g++ libc6-dev"
RUN if [ -n "${COMPILERS}" ]; then \
        apt-get update && apt-get install -y --no-install-recommends ${COMPILERS} \
        && rm -rf /var/lib/apt/lists/*; \
    fi

WORKDIR /opt/kafka-scorer

# The versions CI last passed with (constraints/lock.txt, used as pip constraints when it exists), so
# the image holds what the tests ran on rather than whatever was newest on the day of the build.
COPY constraints ./constraints

# torch first, from the chosen index, in its own layer: it is the big one and changes least often. Its
# version: TORCH_VERSION, else the lock's pin, else the newest.
RUN version="${TORCH_VERSION:-$(sed -n 's/^torch==\([^ ;+\\]*\).*/\1/p' constraints/lock.txt 2>/dev/null || true)}" \
    && pip install --index-url "${TORCH_INDEX_URL}" "torch${version:+==${version}}"

COPY pyproject.toml README.md ./
COPY kafka_scorer ./kafka_scorer
RUN if [ -f constraints/lock.txt ]; then pip install -c constraints/lock.txt .; else pip install .; fi \
    && rm -rf /opt/kafka-scorer/build

USER scorer
WORKDIR /home/scorer

# Prometheus /metrics (KAFKA_SCORER_METRICS_PORT, default 9400).
EXPOSE 9400

ENTRYPOINT ["kafka-scorer"]
CMD ["worker"]
