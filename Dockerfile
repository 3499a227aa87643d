# swarmload: one image for every role (master, worker, collector, simulator target).
#   docker build -t swarmload .
#   docker run --rm swarmload run --target http://HOST:8000 --users 32 --duration 60
# Checked in CI without Docker (tests/test_deploy_files.py): instructions parsed with
# dockerfile-parse, every COPY source present in the repository, the entrypoint a swarmload command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
# the package only (no tests, docs or virtualenvs: .dockerignore); installed editable so the
# locustfile and data files stay where the code finds them (/app/...)
COPY pyproject.toml README.md ./
COPY locustfiles ./locustfiles
COPY workloads ./workloads
COPY collectors ./collectors
COPY dashboards ./dashboards
COPY infra ./infra
RUN pip install -e . && useradd --create-home --uid 10001 swarmload \
    && mkdir -p /results /telemetry && chown swarmload /results /telemetry
USER swarmload

# 5557: Locust master (workers connect); 8000: simulator target; 9109: collect --serve;
# 8501: dashboard
EXPOSE 5557 8000 9109 8501
VOLUME ["/results"]
ENTRYPOINT ["swarmload"]
CMD ["--help"]
