# syntax=docker/dockerfile:1
# The trainer image: NGC PyTorch (CUDA, NCCL, Python 3.12 on Ubuntu 24.04) + EFA (libfabric, rdma-core and
# the aws-ofi-nccl NCCL plugin, all from the EFA installer) + NVIDIA Resiliency Extension 0.7 + the
# trainer package. CDK builds it as an image asset at deploy time; the build context is the repository
# root filtered by .dockerignore (an allow-list: Dockerfile, pyproject.toml, README.md, trainer/).
# Nothing from infra/ goes in: the trainer never imports it.

# The base's torch, CUDA and NCCL are kept as they are: pip may not replace them (see PIP_CONSTRAINT).
# NGC 26.07: torch 2.13.0a0 (the trainer is developed against torch 2.13), CUDA 13, Python 3.12.
ARG BASE_IMAGE=nvcr.io/nvidia/pytorch:26.07-py3
FROM ${BASE_IMAGE}

ARG EFA_INSTALLER_VERSION=1.48.0
# NVRx 0.5-0.7 ship only cp312 manylinux_2_39 wheels: Python 3.12 and glibc 2.39 (Ubuntu 24.04) needed.
ARG NVRX_VERSION=0.7.0
ARG PROMETHEUS_CLIENT_VERSION=0.26.0
ARG XXHASH_VERSION=4.1.0
ARG GRPCIO_VERSION=1.85.4

ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_CONSTRAINT=/etc/pip-base-constraints.txt \
    PYTHONUNBUFFERED=1

# EFA user space for containers: no kernel module (the node's AMI has it), no limits.conf (Kubernetes
# ignores it), no self-test (no EFA device at build time). The installer also installs aws-ofi-nccl
# under /opt/amazon/ofi-nccl; the next step fails the build if it did not.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
    | tar -xz -C /tmp \
 && cd /tmp/aws-efa-installer \
 && ./efa_installer.sh --yes --skip-kmod --skip-limit-conf --no-verify \
 && cd / && rm -rf /tmp/aws-efa-installer \
 && apt-get clean && rm -rf /var/lib/apt/lists/*
# aws-ofi-nccl is libnccl-net-ofi.so in /opt/amazon/ofi-nccl/lib since EFA installer 1.44 (before:
# libnccl-net.so under lib/x86_64-linux-gnu). Make both names exist and register the directory, then
# select the plugin by name, so no other net plugin on the path (NGC ships HPC-X's) can win.
RUN lib="$(find /opt/amazon/ofi-nccl -name 'libnccl-net*.so' | head -n 1)" \
 && { [ -n "$lib" ] || { echo "aws-ofi-nccl is missing from the EFA installer's output" >&2; exit 1; }; } \
 && dir="$(dirname "$lib")" \
 && for name in libnccl-net-ofi.so libnccl-net.so; do \
      [ -e "$dir/$name" ] || ln -s "$(basename "$lib")" "$dir/$name"; done \
 && echo "$dir" > /etc/ld.so.conf.d/000-aws-ofi-nccl.conf && ldconfig

# NCCL loads libnccl-net-<NCCL_NET_PLUGIN>.so from the library path; libfabric's EFA provider from efa/lib.
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl/lib:/opt/amazon/ofi-nccl/lib/x86_64-linux-gnu:/opt/amazon/efa/lib:${LD_LIBRARY_PATH} \
    PATH=/opt/amazon/efa/bin:${PATH} \
    NCCL_NET_PLUGIN=ofi

# Pin what the base ships (torch is a CUDA build matched to its NCCL; numpy is what its packages were
# built against), so installing NVRx fails loudly instead of silently replacing them from PyPI.
RUN python -c "import numpy, torch; print(f'torch=={torch.__version__}'); print(f'numpy=={numpy.__version__}')" \
    > /etc/pip-base-constraints.txt \
 && cat /etc/pip-base-constraints.txt \
 && pip install "nvidia-resiliency-ext==${NVRX_VERSION}" "prometheus-client==${PROMETHEUS_CLIENT_VERSION}" \
    "xxhash==${XXHASH_VERSION}" "grpcio==${GRPCIO_VERSION}"

# The trainer package last, so code changes rebuild only these layers. Its dependencies are installed
# above (torch and numpy come from the base), hence --no-deps.
WORKDIR /workspace/trainer
COPY pyproject.toml README.md ./
COPY trainer/ ./trainer/
RUN pip install --no-deps . \
 && cd / \
 && python -c "import torch, nvidia_resiliency_ext, xxhash, trainer.config.train_config, trainer.events.metrics, trainer.health.server; print('torch', torch.__version__)" \
 && ft_launcher --help > /dev/null \
 && fi_info --version

WORKDIR /workspace
# No USER: the chart sets the security context (root without capabilities except IPC_LOCK by default,
# or a non-root uid with runAsNonRoot=true; see k8s/values.yaml). The pod command is the chart's.
CMD ["ft_launcher", "--help"]
