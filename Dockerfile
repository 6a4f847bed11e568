# fedforge on CPU: the `fedforge` command with the deployment extra, for a
# server or a client (compose.yaml starts a federation of both).
#   docker build -t fedforge:cpu .
#   docker run --rm fedforge:cpu --version
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1

# torch's CPU build first, from PyTorch's CPU index: PyPI's torch for Linux is the
# CUDA build (gigabytes more), and installing it first keeps fedforge's own
# install from choosing another one.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /build
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install ".[deploy]" && rm -rf /build

# An unprivileged user; /fed (a service's certificates), /runs (run stores) and
# the folders compose.yaml's certs service writes belong to it, so empty volumes
# mounted there start out writable by it.
RUN useradd --create-home fedforge \
    && mkdir -p /fed /runs /certs/fed /certs/server /certs/client-0 /certs/client-1 \
    && chown -R fedforge:fedforge /fed /runs /certs
USER fedforge
WORKDIR /home/fedforge

ENTRYPOINT ["fedforge"]
CMD ["--help"]
