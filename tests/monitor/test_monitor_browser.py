"""The monitor's page in a real browser: Debian's Chromium, driven by Playwright.

Playwright's own browser downloads are never used (``playwright install`` is not
run anywhere): the tests launch ``/usr/bin/chromium`` (the ``chromium`` package of
.ci/apt-packages.txt) with a fresh profile.  The first test opens the page of a runner
in another process (the launcher of tests/monitor/test_monitor.py) on each backend and saves the
screenshot that docs/howto/monitor.rst shows (copied there when
``CORRAL_UPDATE_SCREENSHOT`` is set); the second scripts the WebSocket itself
(Playwright's ``route_web_socket``) to check what the page does with any message.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, Page, Route, WebSocketRoute, sync_playwright
from tests.helpers.commands import Child, corral_argv
from tests.helpers.processes import TAG_VAR
from tests.helpers.proxy import free_socket, nginx
from tests.monitor.test_monitor import (
    LOOPBACK,
    ROOT,
    has_lines,
    launcher,
    plain_env,
    port_of,
)
from tests.programs import program

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = ROOT / "docs" / "_static" / "monitor.png"
PAGE = ROOT / "src" / "corral" / "_monitor" / "page.html"

# Colours of the page's palette (as the console's: cyan, yellow, green, ...).
YELLOW = "rgb(229, 229, 16)"
RED = "rgb(241, 76, 76)"


@contextmanager
def chromium(tmp_path: Path) -> Iterator[BrowserContext]:
    """A headless Chromium with a fresh profile, 1100x700."""
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1100, "height": 700},
        )
        context.set_default_timeout(10_000)
        try:
            yield context
        finally:
            context.close()


def rows(page: Page) -> list[dict[str, Any]]:
    """The log rows on the page: source, level and text of each."""
    result: list[dict[str, Any]] = page.eval_on_selector_all(
        "#log .row",
        """rows => rows.map(row => ({
            source: row.dataset.source || null,
            level: row.dataset.level ? Number(row.dataset.level) : null,
            notice: row.classList.contains("notice"),
            text: row.textContent,
        }))""",
    )
    return result


def colour_of(page: Page, selector: str) -> str:
    result: str = page.eval_on_selector(selector, "e => getComputedStyle(e).color")
    return result


# Leaks: Playwright runs its driver (a node process, a child of the test process, which
# starts Chromium) and a thread or two; all are gone once ``sync_playwright()`` has
# exited, so the leak check finds nothing and these tests need no exemption.


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_page_follows_a_live_runner(tmp_path: Path, anyio_backend: str) -> None:
    with launcher(tmp_path, anyio_backend) as runner, chromium(tmp_path) as browser:
        pids = {}
        for name in ("web", "worker", "scheduler"):
            pids[name] = int(runner.command("start", name).split()[2])
        runner.command("say", "web", "out listening on http://127.0.0.1:8080")
        runner.command("say", "scheduler", "log INFO next run of 'reindex' in 30 s")
        page = browser.new_page()
        page.goto(runner.url)
        page.wait_for_selector("#status.live")

        # Every process is in the table, running, with its pid.
        page.wait_for_function(
            "() => document.querySelectorAll('#processes tbody tr').length === 3"
        )
        table = page.eval_on_selector_all(
            "#processes tbody tr",
            "trs => trs.map(tr => [tr.dataset.name, tr.dataset.state, "
            "tr.querySelector('td.pid').textContent])",
        )
        assert table == [[name, "running", str(pid)] for name, pid in pids.items()]
        assert page.text_content("#runner") == "demo"

        # What was said before the page came, and what a child prints after it loaded.
        page.wait_for_selector('#log .row:has-text("listening on http://127.0.0.1:8080")')
        for name, line in [
            ("web", "out GET /health 200 0.4 ms"),
            ("worker", "log INFO processed job 17 in 0.21 s"),
            ("worker", "log WARNING job 18 retried: upstream timed out"),
            ("web", "out POST /orders 201 12.9 ms"),
            ("worker", "log ERROR job 19 failed: upstream returned 502"),
            ("web", "err slow request: GET /report took 2.4 s"),
            ("scheduler", "log INFO ran 'reindex': 1204 documents"),
            ("web", "out <b>not bold</b> <img src=x onerror=alert(1)>"),
            ("worker", "out printed after the page loaded"),
        ]:
            runner.command("say", name, line)
        page.wait_for_selector('#log .row:has-text("printed after the page loaded")')
        # Text from the runner is text, never markup.
        page.wait_for_selector('#log .row:has-text("<b>not bold</b>")')
        assert page.locator("#log img, #log b").count() == 0

        # Coloured as the console: warnings yellow, errors red, a colour per source.
        assert colour_of(page, '#log .row.warning:has-text("job 18") .msg') == YELLOW
        assert colour_of(page, '#log .row.error:has-text("job 19") .msg') == RED
        source_colours = {
            name: colour_of(page, f'#log .row[data-source="demo.{name}"] .source')
            for name in ("web", "worker", "scheduler")
        }
        assert len(set(source_colours.values())) == 3, source_colours

        # The source filter: only that source's rows remain.
        page.select_option("#source-filter", "demo.worker")
        shown = rows(page)
        assert shown and {row["source"] for row in shown} == {"demo.worker"}
        assert any("printed after the page loaded" in row["text"] for row in shown)
        # The level filter, on top of it.
        page.select_option("#level-filter", "30")
        assert [row["level"] for row in rows(page)] == [30, 40]
        page.select_option("#source-filter", "*")
        page.select_option("#level-filter", "20")
        assert {row["source"] for row in rows(page)} == {
            "demo",
            "demo.web",
            "demo.worker",
            "demo.scheduler",
        }

        # A child's stderr is unmistakable; a narrow window shows the table whole.
        assert_stderr_unmistakable(page, "slow request", "GET /health 200")
        assert_fits(page, 400)
        assert_fits(page, 1100)

        # What each costs, live from the runner's samples: a figure, then a sparkline.
        page.wait_for_selector('#processes tr[data-name="web"] td.mem canvas.spark')
        assert page.text_content('#processes tr[data-name="web"] td.mem .figure').endswith("MiB")

        page.locator("#log").evaluate("log => { log.scrollTop = log.scrollHeight; }")
        screenshot = tmp_path / "monitor.png"
        page.screenshot(path=str(screenshot))
        assert screenshot.stat().st_size > 10_000
        if os.environ.get("CORRAL_UPDATE_SCREENSHOT") and anyio_backend == "asyncio":
            # The picture in the docs, made this way on demand:
            # CORRAL_UPDATE_SCREENSHOT=1 pytest tests/monitor/test_monitor_browser.py
            shutil.copyfile(screenshot, SCREENSHOT)

        # The runner ends: the page says so, and shows how each process ended.
        runner.end_input()
        page.wait_for_selector("#status.ended")
        assert page.text_content("#status") == "ended"
        assert page.is_visible("#ended-banner")
        states = page.eval_on_selector_all(
            "#processes tbody tr", "trs => trs.map(tr => [tr.dataset.name, tr.dataset.state])"
        )
        assert dict(states) == {"web": "exited", "worker": "exited", "scheduler": "exited"}
        # The banner did not push the last lines out of view.
        assert page.locator("#log").evaluate(LAST_ROW_VISIBLE)
        assert runner.finish() == 0


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_page_says_so_when_the_runner_is_gone(tmp_path: Path, tag: str) -> None:
    """Killed, a runner sends no "end": the page sees its monitor go, says that nothing
    answers there any more and keeps trying, but never that the runner has ended."""
    env = {**os.environ, TAG_VAR: tag}  # the tag fixture checks that no child outlives it
    with launcher(tmp_path, "asyncio", env=env) as runner, chromium(tmp_path) as browser:
        runner.command("start", "web")
        page = browser.new_page()
        page.goto(runner.url)
        page.wait_for_selector('#processes tr[data-name="web"][data-state="running"]')
        runner.proc.send_signal(signal.SIGKILL)
        runner.proc.wait()
        page.wait_for_selector("#status.closed")
        assert page.text_content("#status") == "disconnected"
        lost = page.text_content("#lost-banner") or ""
        assert lost.startswith("Lost the monitor: nothing answers at 127.0.0.1:"), lost
        assert "connection refused" in lost and lost.endswith("trying again."), lost
        assert not page.is_visible("#ended-banner")


# -- behind a reverse proxy --------------------------------------------------------------------


def _through(base: str, url: str) -> str:
    """The monitor's page ``url`` as the proxy at ``base`` serves it (the token kept)."""
    return base + "?" + urllib.parse.urlsplit(url).query


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_page_behind_nginx(tmp_path: Path, anyio_backend: str, tag: str) -> None:
    """Debian's nginx at ``/corral/`` on a port of its own, the usual WebSocket recipe, and
    the proxy's origin named in ``monitor_origins``: the page is live through it."""
    listening = free_socket()
    origin = f"http://127.0.0.1:{listening.getsockname()[1]}"
    env = {**os.environ, TAG_VAR: tag}
    options = {"monitor_origins": [origin]}
    with (
        listening,
        launcher(tmp_path, anyio_backend, env=env, runner=options) as runner,
        nginx(tmp_path / "nginx", listening, port_of(runner.url)) as base,
        chromium(tmp_path) as browser,
    ):
        runner.command("start", "web")
        runner.command("say", "web", "out through the proxy")
        page = browser.new_page()
        page.goto(_through(base, runner.url))
        page.wait_for_selector('#processes tr[data-name="web"][data-state="running"]')
        page.wait_for_selector('#log .row:has-text("through the proxy")')
        assert page.text_content("#status") == "live"
        assert not page.is_visible("#lost-banner")
        runner.command("say", "web", "out after the page came")
        page.wait_for_selector('#log .row:has-text("after the page came")')


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["origin-not-named", "no-websocket-recipe"])
def test_the_page_behind_nginx_says_why_it_cannot_connect(
    tmp_path: Path, tag: str, case: str
) -> None:
    """Each reason the page's WebSocket fails behind a proxy, said as it is, with what to do;
    "the runner has ended" never (it has not)."""
    listening = free_socket()
    origin = f"http://127.0.0.1:{listening.getsockname()[1]}"
    env = {**os.environ, TAG_VAR: tag}
    options = {} if case == "origin-not-named" else {"monitor_origins": [origin]}
    with (
        listening,
        launcher(tmp_path, "asyncio", env=env, runner=options) as runner,
        nginx(
            tmp_path / "nginx",
            listening,
            port_of(runner.url),
            websocket=case != "no-websocket-recipe",
        ) as base,
        chromium(tmp_path) as browser,
    ):
        runner.command("start", "web")
        page = browser.new_page()
        page.goto(_through(base, runner.url))
        page.wait_for_selector("#status.closed")
        lost = page.text_content("#lost-banner") or ""
        status = page.text_content("#status")
        assert not page.is_visible("#ended-banner")
        if case == "origin-not-named":
            assert status == "refused", status
            assert f"does not let pages from {origin} connect" in lost, lost
            assert f'monitor_origins=["{origin}"]' in lost, lost
            assert f"--monitor-origin {origin}" in lost, lost
        else:
            assert status == "cannot connect", status
            assert "must pass WebSocket upgrades" in lost and lost.endswith("again."), lost


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_page_of_a_run_gone_says_the_next_run_refuses_its_token(
    tmp_path: Path, tag: str
) -> None:
    """A run killed, and another on the same port: the page of the first comes back to a
    monitor that refuses its token, and says so (not that the runner ended)."""
    env = {**os.environ, TAG_VAR: tag}
    with chromium(tmp_path) as browser:
        with launcher(tmp_path, "asyncio", env=env) as first:
            page = browser.new_page()
            page.goto(first.url)
            page.wait_for_selector("#status.live")
            address = f"127.0.0.1:{port_of(first.url)}"
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait()
        page.wait_for_selector("#status.closed")
        options = {"monitor": address}
        with launcher(tmp_path, "asyncio", name="next", env=env, runner=options):
            page.wait_for_selector('#status:has-text("refused")', timeout=20_000)
        lost = page.text_content("#lost-banner") or ""
        assert "refused this page's token" in lost, lost
        assert not page.is_visible("#ended-banner")


# -- the page's logic, with a scripted server --------------------------------------------------


class Server:
    """The monitor's side of the page's WebSocket, played by the test."""

    def __init__(self) -> None:
        self.connections: list[WebSocketRoute] = []
        self.received: list[Any] = []

    def accept(self, socket: WebSocketRoute) -> None:
        self.connections.append(socket)
        socket.on_message(lambda message: self.received.append(json.loads(message)))

    def send(self, **message: Any) -> None:
        self.connections[-1].send(json.dumps(message))


def process(
    name: str, state: str = "running", code: int | None = None, runner: str = "demo"
) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"{runner}.{name}",
        "pid": 1000 + len(name),
        "state": state,
        "returncode": code,
        "signal": signal.Signals(-code).name if code is not None and code < 0 else None,
        "started": 1_700_000_000.0,
        "restarts": 0,
    }


#: Whether the canvas of a sparkline has a line drawn on it.
DRAWN = """selector => {
    const canvas = document.querySelector(selector);
    const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    return pixels.some((value, i) => i % 4 === 3 && value > 0);
}"""


def figures(
    pid: int, *, cpu: float, rss: int, gpu: int | None = None, host: str | None = None
) -> dict[str, Any]:
    return {"pid": pid, "cpu": cpu, "rss": rss, "gpu": gpu, "processes": 1, "host": host}


def record(n: int, source: str = "demo.web", level: int = 20) -> list[Any]:
    return [source, "stdout", level, 1_700_000_000.0 + n / 1000, None, f"line {n}"]


@pytest.mark.slow
@pytest.mark.timeout(120)  # 33 s was seen under a load of 15
def test_the_page_keeps_its_promises(tmp_path: Path) -> None:
    server = Server()
    url = "http://monitor.test/?token=t0k3n"

    def serve_page(route: Route) -> None:
        route.fulfill(status=200, content_type="text/html; charset=utf-8", body=PAGE.read_text())

    with chromium(tmp_path) as browser:
        page = browser.new_page()
        page.route("http://monitor.test/**", serve_page)
        page.route_web_socket("ws://monitor.test/**", server.accept)
        page.goto(url)
        page.wait_for_selector("#status.live")
        # It connected to the address it was loaded from, token and all.
        assert [c.url for c in server.connections] == ["ws://monitor.test/?token=t0k3n"]

        hello = {"v": 1, "runner": "demo", "log_path": "/var/log/demo/20261130-103300-demo"}
        # What each process cost over the last 200 s, a remote worker's too: the page keeps
        # the last 180 samples of each for its sparklines.
        samples = [
            {
                "time": 1_700_000_000.0 + i,
                "processes": {
                    "web": figures(1004, cpu=i % 50, rss=(100 + i) << 20),
                    "worker": figures(1007, cpu=0.0, rss=20 << 20),
                    "agent-1.worker-0": figures(77, cpu=99.5, rss=3 << 30, host="node2"),
                },
            }
            for i in range(200)
        ]
        server.send(
            type="hello", **hello, processes=[process("web"), process("worker")], usage=samples
        )
        page.wait_for_function(
            "() => document.querySelectorAll('#processes tbody tr').length === 3"
        )
        assert page.text_content("#log-path") == hello["log_path"]
        web, remote = (
            '#processes tr[data-name="web"]',
            '#processes tr[data-name="agent-1.worker-0"]',
        )
        assert page.text_content(f"{web} td.cpu .figure") == "49.0%"
        assert page.text_content(f"{web} td.mem .figure") == "299 MiB"
        assert page.get_attribute(f"{web} td.cpu canvas.spark", "data-points") == "180"
        assert page.get_attribute(f"{web} td.mem canvas.spark", "data-points") == "180"
        page.wait_for_function(DRAWN, arg=f"{web} td.cpu canvas.spark")  # a line, not a blank
        assert page.text_content(f"{remote} td.cpu .figure") == "99.5%"
        assert page.text_content(f"{remote} td.mem .figure") == "3.0 GiB"
        assert page.text_content(f"{remote} td.pid") == "77"
        assert "node2" in (page.get_attribute(f"{remote} td.cpu", "title") or "")
        assert not page.is_visible(f"{web} td.gpu")  # no GPU anywhere: no column
        # A live sample: the figures move on; the remote worker that is gone leaves.
        server.send(
            type="usage",
            time=1_700_000_200.0,
            processes={"web": figures(1004, cpu=12.5, rss=1 << 30, gpu=2 << 30)},
        )
        page.wait_for_selector(f'{web} td.cpu .figure:has-text("12.5%")')
        assert page.locator(remote).count() == 0
        assert page.text_content(f"{web} td.gpu .figure") == "2.0 GiB"
        not_sampled = "\u2013"  # the page's dash for what it does not know
        assert page.text_content('#processes tr[data-name="worker"] td.cpu') == not_sampled

        # The DOM stays bounded: the last 2,000 rows.
        server.send(type="logs", records=[record(n) for n in range(2500)])
        page.wait_for_selector('#log .row:last-child:has-text("line 2499")')
        shown = rows(page)
        assert len(shown) == 2000
        assert shown[0]["text"].endswith("line 500")
        # Following the tail: scrolled to the end.
        at_end = "log => log.scrollHeight - log.scrollTop - log.clientHeight < 8"
        assert page.locator("#log").evaluate(at_end)

        # Told of dropped records: a notice in the log and a counter.
        server.send(type="dropped", count=42)
        page.wait_for_selector("#log .row.notice:has-text('dropped 42')")
        assert page.text_content("#dropped") == "dropped 42"
        assert page.is_visible("#dropped")

        # Scrolled up by the user: new rows do not pull the view down.
        page.locator("#log").evaluate("log => { log.scrollTop = 0; }")
        page.wait_for_selector('#log[data-follow="false"]')
        server.send(type="logs", records=[record(3000, "demo.worker", 30)])
        page.wait_for_selector("#follow.shown")
        assert page.locator("#log").evaluate("log => log.scrollTop") == 0
        page.click("#follow")
        page.wait_for_selector('#log[data-follow="true"]')
        assert page.locator("#log").evaluate(at_end)

        # Levels: warnings yellow, errors red; the level filter keeps what it should.
        server.send(
            type="logs",
            records=[record(3001, "demo.worker", 40), record(3002, "demo.worker", 50)],
        )
        page.wait_for_selector('#log .row:has-text("line 3002")')
        assert colour_of(page, '#log .row:has-text("line 3000") .msg') == YELLOW
        assert colour_of(page, '#log .row:has-text("line 3001") .msg') == RED
        page.select_option("#level-filter", "40")
        assert [row["level"] for row in rows(page) if not row["notice"]] == [40, 50]

        # A state change.
        server.send(type="process", **process("worker", "failed", 3))
        page.wait_for_selector('#processes tr[data-name="worker"][data-state="failed"]')
        assert page.text_content('#processes tr[data-name="worker"] td.code') == "3"

        # The connection drops while the runner lives: the page connects again, and
        # what the monitor sends again on connecting is not shown twice.
        page.select_option("#level-filter", "10")
        before = len(rows(page))
        server.connections[-1].close()
        page.wait_for_selector('#status.live[data-connections="2"]')
        assert len(server.connections) == 2
        server.send(type="hello", **hello, processes=[process("web")])
        server.send(type="logs", records=[record(n) for n in range(2990, 3003)] + [record(3003)])
        page.wait_for_selector('#log .row:has-text("line 3003")')
        assert len(rows(page)) == min(before + 1, 2000)
        page.wait_for_function(
            "() => document.querySelectorAll('#processes tbody tr').length === 1"
        )

        # The end: said clearly, and no more connections.
        server.send(type="end")
        page.wait_for_selector("#status.ended")
        assert page.is_visible("#ended-banner")
        server.connections[-1].close()
        page.wait_for_selector('#status[data-closed="2"]')
        # (Had it meant to reconnect, it would say so as the connection closed.)
        assert page.text_content("#status") == "ended"
        assert len(server.connections) == 2
        # The page never talks back (filters are its own).
        assert server.received == []


# -- the page at its ends: the end, a narrow window, stderr ------------------------------------

#: Whether the last row of the log is wholly inside the log's visible box.
LAST_ROW_VISIBLE = """log => {
    const row = log.lastElementChild, box = log.getBoundingClientRect();
    const r = row.getBoundingClientRect();
    return r.top >= box.top - 1 && r.bottom <= box.bottom + 1;
}"""
#: What sticks out of the page or the table sideways (0 when nothing does).
OVERFLOW = """() => {
    const doc = document.documentElement, box = document.querySelector("#processes-box");
    const table = document.querySelector("#processes");
    return {
        page: doc.scrollWidth - doc.clientWidth,
        box: box.scrollWidth - box.clientWidth,
        table: table.getBoundingClientRect().right - doc.clientWidth,
    };
}"""


def assert_stderr_unmistakable(page: Page, stderr_text: str, stdout_text: str) -> None:
    """A stderr row has a label saying so, a coloured edge and a tinted background."""
    err = page.locator(f'#log .row:has-text("{stderr_text}")')
    out = page.locator(f'#log .row:has-text("{stdout_text}")')
    assert err.locator(".stream-label").text_content() == "stderr"
    assert err.locator(".stream-label").is_visible()
    assert out.locator(".stream-label").count() == 0
    style = (
        "r => { const s = getComputedStyle(r);"
        " return [s.borderLeftWidth, s.borderLeftColor, s.backgroundColor]; }"
    )
    err_edge, err_colour, err_background = err.evaluate(style)
    _, _, out_background = out.evaluate(style)
    assert float(err_edge.removesuffix("px")) >= 3 and err_colour == RED
    assert err_background != out_background


def assert_fits(page: Page, width: int) -> None:
    page.set_viewport_size({"width": width, "height": 700})
    sticks_out = page.evaluate(OVERFLOW)
    assert all(v <= 0.5 for v in sticks_out.values()), sticks_out


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("ending", ["end", "connection-lost"])
def test_the_page_at_its_ends(tmp_path: Path, ending: str) -> None:
    server = Server()

    def serve_page(route: Route) -> None:
        route.fulfill(status=200, content_type="text/html; charset=utf-8", body=PAGE.read_text())

    with chromium(tmp_path) as browser:
        page = browser.new_page()
        page.route("http://monitor.test/**", serve_page)
        page.route_web_socket("ws://monitor.test/**", server.accept)
        page.goto("http://monitor.test/?token=t")
        page.wait_for_selector("#status.live")
        long_names = [process(f"agent-{i}.worker-{i}-with-a-long-name") for i in range(3)]
        server.send(
            type="hello",
            v=1,
            runner="demo-runner-with-a-long-name",
            log_path="/var/log/a/rather/long/folder/20261130-103300-demo-runner-with-a-long-name",
            processes=[process("web"), *long_names],
        )
        err = ["demo.web", "stderr", 20, 1_700_000_001.0, None, "Traceback: the stderr line"]
        records = [record(n) for n in range(200)] + [err, record(200)]
        server.send(type="logs", records=records)
        page.wait_for_selector('#log .row:last-child:has-text("line 200")')

        # stderr is unmistakable: a label, a red edge, a tinted row.
        assert_stderr_unmistakable(page, "the stderr line", "line 200")

        # A 400 px wide window shows the table without overflow (and the page too).
        assert_fits(page, 400)
        assert page.is_visible('#processes tr[data-name="web"] td.state .badge')
        assert_fits(page, 1100)

        # The runner ends: the banner comes, and the last lines stay in view.
        assert page.locator("#log").evaluate(LAST_ROW_VISIBLE)
        if ending == "end":
            server.send(type="logs", records=[record(201)])
            server.send(type="end")
            page.wait_for_selector("#status.ended")
        else:
            server.send(type="logs", records=[record(201)])
            page.wait_for_selector('#log .row:last-child:has-text("line 201")')
            page.route_web_socket("ws://monitor.test/**", lambda ws: ws.close())
            server.connections[-1].close()
            page.wait_for_selector("#status.closed")
            # Nothing said the runner ended: the page says it lost the monitor, and why.
            assert not page.is_visible("#ended-banner")
        banner = "#ended-banner" if ending == "end" else "#lost-banner"
        page.wait_for_selector(banner, state="visible")
        assert page.text_content("#log .row:last-child").endswith("line 201")
        assert page.locator("#log").evaluate(LAST_ROW_VISIBLE)
        # And still after the window narrows.
        assert_fits(page, 400)
        assert page.locator("#log").evaluate(LAST_ROW_VISIBLE)


#: Whether the page follows the tail: the last row in view, no "new lines" button.
FOLLOWING = """log => {
    const row = log.lastElementChild, box = log.getBoundingClientRect();
    const r = row.getBoundingClientRect();
    return log.dataset.follow === "true" && r.top >= box.top - 1 && r.bottom <= box.bottom + 1
        && !document.querySelector("#follow").classList.contains("shown");
}"""
#: The state badges cut short in their cells (none should be).
BADGES_CUT = """() => [...document.querySelectorAll("#processes td.state")].filter(
    td => td.querySelector(".badge").getBoundingClientRect().right
        > td.getBoundingClientRect().right + 0.5).map(td => td.parentElement.dataset.name)"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_page_follows_the_log_at_any_width(tmp_path: Path) -> None:
    """At 320, 400 and 1200 px, and through resizes under a flood, the page keeps following:
    the failure's last line in view, each end named (one failure is one ``failed``)."""
    with chromium(tmp_path) as browser:
        for width, then in [(320, 1200), (400, 320), (1200, 400)]:
            server = Server()
            page = browser.new_page()
            page.set_viewport_size({"width": width, "height": 640})
            page.route(
                "http://monitor.test/**",
                lambda route: route.fulfill(
                    status=200, content_type="text/html; charset=utf-8", body=PAGE.read_text()
                ),
            )
            page.route_web_socket("ws://monitor.test/**", server.accept)
            page.goto("http://monitor.test/?token=t")
            page.wait_for_selector("#status.live")
            names = [f"agent-0.worker-{rank}" for rank in range(4)]
            server.send(type="hello", v=1, runner="run", log_path=None, processes=[])
            for burst in range(24):
                if burst < len(names):  # the table grows under the log
                    server.send(type="process", **process(names[burst], runner="run"))
                rows = [
                    [
                        f"run.{names[n % 4]}",
                        "stdout",
                        20,
                        1.7e9 + n,
                        None,
                        f"step {n} loss 0.{n:04d}, and words enough to wrap on a phone",
                    ]
                    for n in range(burst * 50, burst * 50 + 50)
                ]
                server.send(type="logs", records=rows)
                if burst == 10:  # a resize under the flood: rows rewrap, the box changes
                    page.set_viewport_size({"width": then, "height": 640})
                if burst == 18:
                    page.set_viewport_size({"width": width, "height": 640})
            last = "RuntimeError: rank 1 broke"
            server.send(type="logs", records=[[f"run.{names[1]}", "stderr", 30, 1.8e9, None, last]])
            server.send(type="process", **process(names[1], "failed", 3, runner="run"))
            for name in (names[0], names[2], names[3]):
                server.send(type="process", **process(name, "stopped", -15, runner="run"))
            failure = {
                "name": names[1],
                "source": f"run.{names[1]}",
                "returncode": 3,
                "stderr": [last],
            }
            server.send(type="end", status=3, failure=failure)
            page.wait_for_selector("#status.ended")
            page.wait_for_selector(f'#log .row:last-child:has-text("{last}")')
            assert page.locator("#log").evaluate(FOLLOWING), width
            states = page.eval_on_selector_all(
                "#processes tbody tr",
                "trs => trs.map(tr => [tr.dataset.name, tr.querySelector('.badge').textContent])",
            )
            assert dict(states) == {
                names[0]: "stopped",
                names[1]: "failed",
                names[2]: "stopped",
                names[3]: "stopped",
            }
            assert page.evaluate(BADGES_CUT) == [], width
            banner = page.text_content("#ended-banner")
            assert banner is not None
            assert banner.startswith(
                f"The runner has ended with status 3: {names[1]} exited with code 3 ({last})"
            ), banner
            assert_fits(page, width)
            assert page.locator("#log").evaluate(FOLLOWING), width
            page.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_failing_run_as_the_page_and_tail_tell_it(tmp_path: Path, tag: str) -> None:
    """``corral run`` whose rank 1 fails: one ``failed``, the siblings ``stopped`` SIGTERM, on
    a 320 px page that still shows the failure's lines; ``corral tail`` exits with the run's
    status and says the failure."""
    go = tmp_path / "go"
    os.mkfifo(go)
    env = {**plain_env(), TAG_VAR: tag}
    argv = corral_argv("run", "-n", "3", "--monitor", LOOPBACK, "--", *program("failing_rank", go))
    with (
        Child(argv, tmp_path / "run.err", merge=True, env=env, cwd=tmp_path) as run,
        chromium(tmp_path) as browser,
    ):
        url = run.wait_line(lambda line: "monitor at" in line).rpartition(" ")[2]
        tail = Child(corral_argv("tail", url), tmp_path / "tail.err", env=env)
        with tail:
            page = browser.new_page()
            page.set_viewport_size({"width": 320, "height": 600})
            page.goto(url)
            for rank in range(3):
                page.wait_for_selector(f'#log .row:has-text("up {rank}")')
            has_lines(tail, [f"| up {rank}" for rank in range(3)])
            go.write_text("go\n")
            assert run.finish() == 3, run.text()
            assert tail.finish() == 3, tail.text()
        page.wait_for_selector("#status.ended")
        rows = page.eval_on_selector_all(
            "#processes tbody tr",
            "trs => trs.map(tr => [tr.dataset.name, tr.dataset.state,"
            " tr.querySelector('td.code').textContent])",
        )
        assert sorted(rows) == [
            ["agent-0.worker-0", "stopped", "-15"],
            ["agent-0.worker-1", "failed", "3"],
            ["agent-0.worker-2", "stopped", "-15"],
        ]
        assert page.evaluate(BADGES_CUT) == []
        assert_fits(page, 320)
        assert page.locator("#log").evaluate(FOLLOWING)
        assert "status 3: agent-0.worker-1 exited with code 3" in (
            page.text_content("#ended-banner") or ""
        )
    said = tail.stderr_path.read_text().splitlines()
    assert said == [
        "corral: agent-0.worker-1 exited with code 3; its last stderr lines:",
        "  ValueError: rank 1 broke",
    ], said


#: Each name cell: its name, the end it keeps whole, whether that end is all in view, whether
#: the rest of the name had to be cut.
NAME_CELLS = """() => [...document.querySelectorAll("#processes td.name")].map(td => {
    const tail = td.querySelector(".tail"), head = td.querySelector(".head");
    const box = td.getBoundingClientRect(), end = tail.getBoundingClientRect();
    const text = document.createRange();
    text.selectNodeContents(head);
    return {
        name: td.parentElement.dataset.name,
        tail: tail.textContent,
        whole: end.left >= box.left - 0.5 && end.right <= box.right + 0.5,
        cut: text.getBoundingClientRect().width > head.getBoundingClientRect().width,
    };
})"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_long_name_keeps_its_distinguishing_end_when_cut(tmp_path: Path) -> None:
    """At 400 px the names of a launch's workers (a second launch of the runner's: numbered)
    are cut in the middle: each keeps its end (``1.worker-3``), which tells it from the
    others; at 1100 px nothing is cut."""
    server = Server()
    names = [f"launch-2.agent-{a}.worker-{w}" for a in range(2) for w in range(4)]
    with chromium(tmp_path) as browser:
        page = browser.new_page()
        page.set_viewport_size({"width": 400, "height": 700})
        page.route(
            "http://monitor.test/**",
            lambda route: route.fulfill(
                status=200, content_type="text/html; charset=utf-8", body=PAGE.read_text()
            ),
        )
        page.route_web_socket("ws://monitor.test/**", server.accept)
        page.goto("http://monitor.test/?token=t")
        page.wait_for_selector("#status.live")
        processes = [process(name) for name in names]
        server.send(type="hello", v=1, runner="train", log_path=None, processes=processes)
        page.wait_for_function("() => document.querySelectorAll('#processes tbody tr').length > 7")
        cells = page.evaluate(NAME_CELLS)
        assert [c["name"] for c in cells] == names
        assert all(c["cut"] for c in cells), cells  # 400 px: too narrow for the whole names
        assert all(c["whole"] for c in cells), cells
        assert [c["tail"] for c in cells] == [name[-10:] for name in names]
        assert len({c["tail"] for c in cells}) == len(names)
        page.set_viewport_size({"width": 1100, "height": 700})
        cells = page.evaluate(NAME_CELLS)
        assert not any(c["cut"] for c in cells), cells
