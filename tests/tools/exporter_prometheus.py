"""`tidepool exporter` scraped by a real Prometheus server, all on loopback.

Two processes share a ledger (each `tidepool run --quota 25% --ledger NAME --
preload_app --wait`, tests/preload's program on its fake 16 GiB device), the
exporter serves that ledger, and a Prometheus server started with a scrape
config pointing at the exporter is asked through its HTTP API for their
series. Bounded in time (every wait has a deadline); every process it starts
is stopped and the ledger unlinked, whatever happens.

Usage: exporter_prometheus.py TIDEPOOL_CLI PRELOAD_APP. Exits 77 (skipped)
when Debian's prometheus package is not installed (scripts/install-deps --test).
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

GiB = 1 << 30
MiB = 1 << 20
FAKE_DEVICE_BYTES = 16 * GiB  # tests/preload/fake_cuda.c's device
DEADLINE_SECONDS = 90


def free_loopback_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def read_until(process, word, deadline):
    """The lines `process` prints up to one starting with `word`, by first word."""
    lines = {}
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise AssertionError(f"{process.args[0]} ended before printing {word!r}: {lines}")
        first, _, rest = line.strip().partition(" ")
        lines[first] = rest
        if first == word:
            return lines
    raise AssertionError(f"no {word!r} from {process.args} in time")


def query(prometheus_port, promql):
    url = f"http://127.0.0.1:{prometheus_port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]["result"]


def main(cli, app):
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        print("SKIP: the prometheus server is not installed (Debian's prometheus; scripts/install-deps --test)")
        return 77
    deadline = time.monotonic() + DEADLINE_SECONDS
    segment = f"/tidepool-exporter-prometheus-{os.getpid()}"
    workdir = tempfile.mkdtemp(prefix="tidepool-prometheus-")
    processes = []
    try:
        workers = []
        for _ in range(2):
            worker = subprocess.Popen([cli, "run", "--quota", "25%", "--ledger", segment, "--", app, "--wait"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            processes.append(worker)
            workers.append(int(read_until(worker, "ready", deadline)["pid"]))

        exporter_port = free_loopback_port()
        exporter = subprocess.Popen([cli, "exporter", "--listen", f"127.0.0.1:{exporter_port}", "--segment", segment],
                                    stdout=subprocess.PIPE, text=True)
        processes.append(exporter)
        read_until(exporter, "tidepool", deadline)  # "tidepool exporter: serving ..."

        config = os.path.join(workdir, "prometheus.yml")
        with open(config, "w") as out:
            out.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      "scrape_configs:\n  - job_name: tidepool\n    static_configs:\n"
                      f"      - targets: ['127.0.0.1:{exporter_port}']\n")
        prometheus_port = free_loopback_port()
        server = subprocess.Popen([prometheus, f"--config.file={config}",
                                   f"--storage.tsdb.path={os.path.join(workdir, 'data')}",
                                   f"--web.listen-address=127.0.0.1:{prometheus_port}"],
                                  stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "log"), "w"))
        processes.append(server)

        # Wait for a scrape that has both processes.
        selector = f'tidepool_process_reserved_bytes{{job="tidepool",segment="{segment}"}}'
        series = []
        while time.monotonic() < deadline:
            try:
                series = query(prometheus_port, selector)
            except OSError:
                series = []  # not listening yet
            if len(series) == 2:
                break
            if server.poll() is not None:
                raise AssertionError("prometheus exited: " + open(os.path.join(workdir, "log")).read()[-2000:])
            time.sleep(0.5)
        assert len(series) == 2, f"Prometheus has {series} for {selector}"

        quota = int(FAKE_DEVICE_BYTES * 0.25)
        by_pid = {int(s["metric"]["pid"]): s for s in series}
        assert set(by_pid) == set(workers), (by_pid.keys(), workers)
        for pid in workers:
            labels = by_pid[pid]["metric"]
            assert labels["command"] == "preload_app", labels
            assert labels["device"], labels
            # 75% of the quota preallocated, then 1 MiB held (test_ledger_shows_a_running_process).
            assert float(by_pid[pid]["value"][1]) == quota // 4 * 3 + MiB, by_pid[pid]
        quotas = query(prometheus_port, f'tidepool_process_quota_bytes{{segment="{segment}"}}')
        assert sorted(float(s["value"][1]) for s in quotas) == [quota, quota], quotas
        committed = query(prometheus_port, f'tidepool_ledger_committed_bytes{{segment="{segment}"}}')
        assert [float(s["value"][1]) for s in committed] == [2 * quota], committed
        up = query(prometheus_port, 'up{job="tidepool"}')
        assert [s["value"][1] for s in up] == ["1"], up
        print(f"ok: Prometheus on 127.0.0.1:{prometheus_port} scraped the exporter on 127.0.0.1:{exporter_port}: "
              f"{len(series)} processes, {quota // 4 * 3 + MiB} bytes reserved each")

        # The exporter answers while ledgers come and go: the workers end, and
        # the next scrape still succeeds.
        for worker in processes[:2]:
            worker.stdin.write("go\n")
            worker.stdin.close()
            assert worker.wait(timeout=max(1, deadline - time.monotonic())) == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{exporter_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert "tidepool_exporter_ledgers" in text, text
        assert f'pid="{workers[0]}"' not in text, text
        return 0
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        if os.path.exists("/dev/shm" + segment):
            os.unlink("/dev/shm" + segment)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
