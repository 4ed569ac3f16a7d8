"""Render a profile to the HTML report, open it in a real headless Chromium, keep a screenshot and
print what was checked: console messages (a CSP violation is one), page errors, and every network
request the page made besides loading itself.

    python benchmarks/html_render.py [PROFILE.json] [--out docs/measurements/html-report.png]

Without a profile it measures one first: the built-in loop, small, with the host sampler. Chromium
(Debian's `chromium` package) is driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: fd 3 in, fd 4 out, NUL-separated JSON), so nothing beyond the standard
library is needed. Exit 0 when the page is clean, 1 when it is not, 2 when Chromium or the input is
missing. tests/render/test_html.py drives `Chromium` too.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class _Pipe:
    """The DevTools protocol over Chromium's --remote-debugging-pipe."""

    def __init__(self, read_fd: int, write_fd: int):
        self.r, self.w, self.buf, self.next_id, self.events = read_fd, write_fd, b"", 0, []

    def _recv(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("Chromium did not answer in time")
            ready, _, _ = select.select([self.r], [], [], left)
            if ready:
                chunk = os.read(self.r, 1 << 20)
                if not chunk:
                    raise EOFError("Chromium closed the DevTools pipe")
                self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 20.0) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._recv(deadline)
            if m.get("id") == self.next_id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def wait_for(self, method: str, session: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self.events.append(self._recv(deadline))

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._recv(deadline))
        except TimeoutError:
            pass


class Chromium:
    """One headless Chromium, driven over the DevTools protocol on a pipe; `open` loads pages in
    it one at a time, each in a fresh tab. Use as a context manager (the browser and its profile
    folder are removed on exit)."""

    def __init__(self, chromium: str | None = None, timeout: float = 30.0):
        self.path = chromium or find_chromium()
        if self.path is None:
            raise FileNotFoundError("no chromium on PATH (Debian: apt-get install chromium)")
        self.timeout = timeout
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        self.profile_dir = tempfile.mkdtemp(prefix="gpuprof-chromium-")

        def child_fds():  # Chromium reads commands on fd 3 and writes answers on fd 4
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        try:
            self.proc = self._start(to_chrome_r, from_chrome_w, child_fds)
        except OSError:  # not executable, ...: leave no folder or pipe behind
            for fd in (to_chrome_r, to_chrome_w, from_chrome_r, from_chrome_w):
                os.close(fd)
            shutil.rmtree(self.profile_dir, ignore_errors=True)
            raise
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.pipe = _Pipe(from_chrome_r, to_chrome_w)

    def _start(self, to_chrome_r, from_chrome_w, child_fds):
        return subprocess.Popen(
            [self.path, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe",
             f"--user-data-dir={self.profile_dir}", "--no-first-run", "--no-default-browser-check",
             "--hide-scrollbars", "--disable-extensions", "--disable-background-networking",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, pass_fds=(3, 4))

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self, html_path: str | os.PathLike, screenshot: str | os.PathLike | None = None, *,
             width: int = 1000) -> dict:
        """Load a local HTML file in a new tab; {"console": [...], "errors": [...], "requests":
        [urls other than the page], "height": px, "screenshot": path or None}."""
        url = Path(html_path).resolve().as_uri()
        pipe = self.pipe
        target = pipe.call("Target.createTarget", {"url": "about:blank"}, timeout=self.timeout)["targetId"]
        s = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.call(f"{domain}.enable", session=s)
        pipe.call("Page.navigate", {"url": url}, session=s)
        pipe.wait_for("Page.loadEventFired", s, self.timeout)
        pipe.drain(0.3)  # late console messages and requests
        metrics = pipe.call("Page.getLayoutMetrics", session=s)
        height = int((metrics.get("cssContentSize") or metrics["contentSize"])["height"]) + 1
        shot = None
        if screenshot is not None:
            pipe.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                      "deviceScaleFactor": 1, "mobile": False}, session=s)
            data = pipe.call("Page.captureScreenshot", {"format": "png"}, session=s)["data"]
            Path(screenshot).write_bytes(base64.b64decode(data))
            shot = str(screenshot)
        pipe.call("Target.closeTarget", {"targetId": target})
        mine = [e for e in pipe.events if e.get("sessionId") == s]
        pipe.events = [e for e in pipe.events if e.get("sessionId") != s]
        return _summarise(mine, url, height, shot)

    def close(self) -> None:
        try:
            self.pipe.call("Browser.close", timeout=5)
        except (OSError, EOFError, TimeoutError, RuntimeError):
            pass
        for fd in (self.pipe.r, self.pipe.w):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.profile_dir, ignore_errors=True)


def open_page(html_path: str | os.PathLike, screenshot: str | os.PathLike | None = None, *,
              width: int = 1000, chromium: str | None = None, timeout: float = 30.0) -> dict:
    """Load one local HTML file in a fresh headless Chromium (see Chromium.open)."""
    with Chromium(chromium, timeout) as browser:
        return browser.open(html_path, screenshot, width=width)


def _summarise(events: list[dict], url: str, height: int, shot: str | None) -> dict:
    console, errors, requests = [], [], []
    for e in events:
        m, p = e.get("method"), e.get("params") or {}
        if m == "Runtime.consoleAPICalled":
            console.append(f"{p.get('type')}: " + " ".join(str(a.get("value", a.get("description")))
                                                           for a in p.get("args") or []))
        elif m == "Log.entryAdded":
            entry = p.get("entry") or {}
            console.append(f"{entry.get('level')} ({entry.get('source')}): {entry.get('text')}")
        elif m == "Runtime.exceptionThrown":
            errors.append(json.dumps(p.get("exceptionDetails"))[:300])
        elif m == "Network.requestWillBeSent":
            req_url = (p.get("request") or {}).get("url")
            if req_url != url:
                requests.append(req_url)
    return {"console": console, "errors": errors, "requests": requests, "height": height,
            "screenshot": shot}


def _profile_for_demo():
    """A small built-in loop run with the host sampler, and its analysis (what `gpuprof diagnose`
    makes): (profile, analysis)."""
    import torch

    from gpuprof.analysis.pipeline import analyze
    from gpuprof.measure.instruments import default_instruments
    from gpuprof.runners.builtin import LoopConfig, run_builtin

    torch.set_num_threads(1)
    cfg = LoopConfig(model="tiny", n_layer=2, n_embd=64, n_head=2, batch_size=4, block_size=64,
                     grad_accum=2, steps=12, warmup=2, device="cpu")
    inst = default_instruments("cpu", None, samplers=True, interval_s=0.05, microbatch=False,
                               flops=False, probe=False)
    prof = run_builtin(cfg, instruments=inst, post_budget_s=0)
    return prof, analyze(prof)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="?", help="a saved profile (default: measure a small run)")
    ap.add_argument("--out", default=str(REPO / "docs" / "measurements" / "html-report.png"),
                    help="where the screenshot goes")
    ap.add_argument("--keep-html", help="also keep the rendered page here")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from gpuprof.errors import GpuprofError
    from gpuprof.render.html import render_html

    chromium = find_chromium()
    if chromium is None:
        print("html_render: no chromium on PATH (Debian: apt-get install chromium); nothing checked",
              file=sys.stderr)
        return 2
    try:
        if args.profile:  # the analysis saved in the file, as `gpuprof export` renders it
            from gpuprof.cli.export import stored_or_fresh

            prof, analysis = stored_or_fresh(Path(args.profile))
        else:
            prof, analysis = _profile_for_demo()
    except GpuprofError as exc:
        print(f"html_render: {exc}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    page = render_html(prof, analysis)
    render_s = time.perf_counter() - t0
    with tempfile.TemporaryDirectory(prefix="gpuprof-html-") as tmp:
        path = Path(args.keep_html) if args.keep_html else Path(tmp) / "report.html"
        path.write_text(page, encoding="utf-8")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        try:
            res = open_page(path, args.out, chromium=chromium)
        except (OSError, EOFError, TimeoutError, RuntimeError) as exc:
            print(f"html_render: Chromium failed: {exc.__class__.__name__}: {exc}", file=sys.stderr)
            return 2
        open_s = time.perf_counter() - t0
    print(f"chromium           {subprocess.run([chromium, '--version'], capture_output=True, text=True).stdout.strip()}")
    print(f"page               {len(page.encode()):,} bytes, rendered in {render_s * 1e3:.1f} ms; "
          f"loaded and captured in {open_s:.1f} s; {res['height']} px tall at 1000 px wide")
    print(f"console messages   {len(res['console'])}" + "".join(f"\n  {c}" for c in res["console"]))
    print(f"page errors        {len(res['errors'])}" + "".join(f"\n  {c}" for c in res["errors"]))
    print(f"network requests   {len(res['requests'])} besides the page itself"
          + "".join(f"\n  {u}" for u in res["requests"]))
    print(f"screenshot         {res['screenshot']}")
    clean = not (res["console"] or res["errors"] or res["requests"])
    print("result             " + ("clean" if clean else "NOT clean"))
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
