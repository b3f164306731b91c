# minibroker in a container:  docker build -t minibroker . && docker run -p 5672:5672 -p 8672:8672 minibroker
# A config file mounted at /etc/minibroker/minibroker.toml is read when present.
# Python 3.11: the interpreter CI tests on, and the cheapest for this broker (issue 19, instructions under valgrind:
# Python 3.12 needs 12-15 % more per message, per transaction and to the listening line, 3.13 8-12 % more;
# `python -m bench.cost`, `python -m bench.startup --callgrind PYTHON`). Security fixes for 3.11 end in 2027-10.
FROM python:3.11-slim

COPY pyproject.toml README.md /src/
COPY minibroker /src/minibroker
RUN pip install --no-cache-dir /src && rm -rf /src \
    && useradd --uid 1001 --no-create-home --shell /usr/sbin/nologin minibroker

USER 1001
# Inside the container only, listen on every interface so the published ports reach the broker; the management
# API (HTTP: JSON, /metrics, the web console at /) is on at 8672.
ENV MINIBROKER_HOST=0.0.0.0 MINIBROKER_HTTP_HOST=0.0.0.0 MINIBROKER_HTTP_PORT=8672
EXPOSE 5672 5671 8672
HEALTHCHECK --interval=5s --timeout=2s --start-period=2s --retries=3 CMD ["minibroker", "check"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["minibroker"]
