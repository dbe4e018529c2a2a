"""A real reverse proxy in front of a monitor: Debian's nginx, with the usual WebSocket recipe.

:func:`nginx` serves ``http://127.0.0.1:PORT/corral/`` from a monitor's ``http://HOST:PORT/``
with the ``location`` block docs/howto/monitor.rst gives (HTTP/1.1 to the monitor, the
``Upgrade`` and ``Connection`` headers passed on), read from the page itself.  nginx runs in
the foreground as the test's child (its master, and one worker the master stops with itself),
with its own configuration, pid file, logs and temporary folders under the test's directory,
and is stopped by its recorded pid; the session's reaper kills it if the session ends first.

The proxy's listening socket is made by the test and handed to nginx (nginx takes sockets
from the ``NGINX`` variable, as in its binary upgrade): its port is known before nginx
starts, any free one, and a connection made before nginx is up waits in the socket's
backlog; nothing is polled.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from tests.helpers import docs
from tests.helpers.hosts import _Daemon

#: The monitor's address behind the proxy, as a path prefix.
PREFIX = "/corral/"

_CONFIG = """\
pid {folder}/nginx.pid;
error_log stderr notice;
daemon off;
worker_processes 1;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {folder}/tmp;
    proxy_temp_path {folder}/tmp;
    fastcgi_temp_path {folder}/tmp;
    uwsgi_temp_path {folder}/tmp;
    scgi_temp_path {folder}/tmp;
    server {{
        listen 127.0.0.1:{port};
{location}
    }}
}}
"""

#: The lines of the recipe that let a WebSocket through (``websocket=False`` leaves them out).
_WEBSOCKET_LINES = ("proxy_http_version", "proxy_set_header Upgrade", "proxy_set_header Connection")


def recipe() -> str:
    """The ``location`` block that docs/howto/monitor.rst gives for nginx (``nginx-recipe``)."""
    [block] = [
        b for b in docs.page_blocks(docs.DOCS / "howto" / "monitor.rst") if b.name == "nginx-recipe"
    ]
    assert block.language == "nginx" and block.code.startswith(f"location {PREFIX} "), block
    return block.code


def _nginx_program() -> str:
    path = shutil.which("nginx", path=f"{os.environ.get('PATH', os.defpath)}:/usr/sbin:/sbin")
    if path is None:
        pytest.skip("nginx is not installed (Debian's nginx: .ci/apt-packages.txt)")
    return path


def free_socket() -> socket.socket:
    """A listening socket on 127.0.0.1, any free port: the proxy's, to give :func:`nginx`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


@contextmanager
def nginx(
    folder: Path, listening: socket.socket, upstream: int, *, websocket: bool = True
) -> Iterator[str]:
    """nginx on ``listening`` in front of ``127.0.0.1:upstream``; yields the proxy's base URL.

    ``websocket=False`` proxies plain HTTP only (no ``Upgrade`` passed on): the
    page loads through it, its WebSocket does not.
    """
    program = _nginx_program()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tmp").mkdir(exist_ok=True)
    port = listening.getsockname()[1]
    config = folder / "nginx.conf"
    location = recipe().replace("127.0.0.1:8765", f"127.0.0.1:{upstream}")
    if not websocket:
        lines = location.splitlines()
        location = "\n".join(x for x in lines if not x.strip().startswith(_WEBSOCKET_LINES))
    config.write_text(_CONFIG.format(folder=folder, port=port, location=location))
    fd = listening.fileno()
    os.set_inheritable(fd, True)
    argv = [program, "-p", str(folder), "-c", str(config), "-e", "stderr"]
    env = {**os.environ, "NGINX": f"{fd};"}
    daemon = _Daemon("nginx", argv, env=env, pass_fds=(fd,))
    with daemon:
        daemon.wait_for(r"start worker process", time.monotonic() + 30)
        yield f"http://127.0.0.1:{port}{PREFIX}"
