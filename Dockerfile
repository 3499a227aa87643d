# swarmload: one image for every role (master, worker, collector, simulator target).
#   docker build -t swarmload .
#   docker run --rm swarmload run --target http://HOST:8000 --users 32 --duration 60
# Checked in CI without Docker (tests/test_deploy_files.py): instructions parsed with
# dockerfile-parse, every COPY source present in the repository, the entrypoint a swarmload command.
# `make image` builds it where no image registry is reachable: FROM a Debian base it makes itself
# (debootstrap + docker import; BASE_IMAGE=swarmload-base:bookworm, Python 3.11 from Debian).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# PIP_BREAK_SYSTEM_PACKAGES: Debian's own Python (the made base) is "externally managed"; the
# image is this one program's, so its packages go where Python looks first
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1

WORKDIR /src
# the package only (no tests, docs or virtualenvs: .dockerignore), installed as a package: the
# locustfile, the dashboard app and the example studies are its package data (importlib.resources)
COPY pyproject.toml README.md LICENSE requirements.lock ./
COPY locustfiles ./locustfiles
COPY workloads ./workloads
COPY collectors ./collectors
COPY dashboards ./dashboards
COPY infra ./infra
RUN pip install -c requirements.lock . && cd / && rm -rf /src && useradd --create-home --uid 10001 swarmload \
    && mkdir -p /results /telemetry && chown swarmload /results /telemetry
USER swarmload
WORKDIR /results

# 5557: Locust master (workers connect); 8000: simulator target; 9109: collect --serve;
# 8501: dashboard
EXPOSE 5557 8000 9109 8501
VOLUME ["/results"]
ENTRYPOINT ["swarmload"]
CMD ["--help"]
