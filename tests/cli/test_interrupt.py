"""Ctrl-C in the middle of a verb: one line, exit 130, no traceback."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from tests.sandboxd.servers import wait_until


def test_ctrl_c_inside_a_verb_is_one_line_and_exit_130(tmp_path: Path) -> None:
    # A control plane that accepts and never answers: the verb waits inside its list.
    silent = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(silent.accept()[0]), daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: d, cluster: {{server: "http://127.0.0.1:{silent.getsockname()[1]}"}}}}]\n'
        "users: [{name: d, user: {}}]\ncontexts: [{name: d, context: {cluster: d, user: d}}]\n"
        "current-context: d\n"
    )
    verb = subprocess.Popen(
        [sys.executable, "-m", "sandboxctl", "inventory", "--source", "kube",
         "--kubeconfig", str(kubeconfig)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a shell's background job has Ctrl-C ignored; this one is a terminal's
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        wait_until(lambda: bool(accepted), timeout=30, what="the verb's request")
        verb.send_signal(signal.SIGINT)
        _, err = verb.communicate(timeout=30)
    finally:
        verb.kill()
        silent.close()
        for connection in accepted:
            connection.close()
    assert verb.returncode == 130
    assert err.strip().splitlines()[-1] == "sandboxctl: interrupted"
    assert "Traceback" not in err
