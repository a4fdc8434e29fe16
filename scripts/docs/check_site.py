#!/usr/bin/python3
"""Checks the built docs site as a reader meets it: every page opened in headless Chromium (Debian's),
rendered (not empty), every internal link and anchor resolved, and every flag the binary accepts present
in the command-line reference.

    check_site.py SITE_DIR CLI_FLAGS_JSON

Exits 1 with one line per problem; prints 'N passed, 0 failed' (pages) when all is well.
"""
import html.parser
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links, self.text, self._in_article, self._skip = set(), [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        if tag in ("a", "link") and a.get("href") and tag == "a":
            self.links.append(a["href"])
        if tag == "article":
            self._in_article += 1
        if tag in ("script", "style"):
            self._skip += 1

    def handle_endtag(self, tag):
        if tag == "article":
            self._in_article -= 1
        if tag in ("script", "style"):
            self._skip -= 1

    def handle_data(self, data):
        if self._in_article and not self._skip:
            self.text.append(data)


def chromium():
    for c in ("chromium", "chromium-browser"):
        p = shutil.which(c)
        if p:
            return p
    sys.exit("check_site: Chromium is not installed (apt-get install chromium)")


class Browser:
    """One headless Chromium for every page, driven over the DevTools protocol (python3-websocket):
    starting a browser per page costs seconds each on a busy machine."""

    def __init__(self, exe, profile):
        import websocket  # Debian's python3-websocket
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-port=0", f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,  # its helpers too
            env={**os.environ, "TMPDIR": profile})  # its own temporary files go where the profile goes
        port_file = os.path.join(profile, "DevToolsActivePort")
        deadline = time.monotonic() + 120
        while not (os.path.exists(port_file) and open(port_file).read().count("\n") >= 1):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = int(open(port_file).read().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30))
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60)
        self.seq = 0
        self.call("Page.enable")

    def call(self, method, **params):
        self.seq += 1
        self.ws.send(json.dumps({"id": self.seq, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.seq:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def render(self, path):
        self.call("Page.navigate", url="file://" + path)
        deadline = time.monotonic() + 60
        while True:
            state = self.call("Runtime.evaluate", expression="document.readyState")["result"].get("value")
            if state == "complete":
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path} did not finish loading")
            time.sleep(0.05)
        return self.call("Runtime.evaluate", expression="document.documentElement.outerHTML")["result"]["value"]

    def close(self):
        """Ends the browser and every helper process it started (its process group), and waits until none
        is left: a helper still writing into the profile would make removing it fail."""
        try:
            self.ws.close()
        finally:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)


def main():
    site, flags_json = sys.argv[1], sys.argv[2]
    browser = chromium()
    pages = {}
    for dirpath, _, files in os.walk(site):
        for f in files:
            if f.endswith(".html") and f != "404.html":
                pages[os.path.realpath(os.path.join(dirpath, f))] = None
    problems = []
    with tempfile.TemporaryDirectory() as profile:
        b = Browser(browser, profile)
        try:
            for path in sorted(pages):
                p = Page()
                p.feed(b.render(path))
                pages[path] = p
        finally:
            b.close()
    for path, p in sorted(pages.items()):
        rel = os.path.relpath(path, site)
        words = " ".join("".join(p.text).split())
        if len(words) < 80:
            problems.append(f"{rel}: renders (almost) empty: {len(words)} characters of text")
        for href in p.links:
            u = urllib.parse.urlparse(href)
            if u.scheme in ("http", "https", "mailto") or href.startswith("javascript:"):
                continue
            target = path if not u.path else os.path.realpath(os.path.join(os.path.dirname(path), urllib.parse.unquote(u.path)))
            if os.path.isdir(target):
                target = os.path.join(target, "index.html")
            if not os.path.exists(target):
                problems.append(f"{rel}: broken link {href}")
                continue
            if u.fragment and target in pages and u.fragment not in pages[target].ids:
                problems.append(f"{rel}: missing anchor {href}")
    cli = next((p for path, p in pages.items() if path.endswith(os.path.join("reference", "cli", "index.html"))
                or path.endswith(os.path.join("reference", "cli.html"))), None)
    if cli is None:
        problems.append("no command-line reference page (reference/cli)")
    else:
        text = "".join(cli.text)
        for cmd, names in json.load(open(flags_json)).items():
            for n in names:
                if f"--{n}" not in text:
                    problems.append(f"reference/cli: flag --{n} of '{cmd}' missing")
    for line in problems:
        print(line)
    print(f"{len(pages) - len({x.split(':')[0] for x in problems})} passed, {len({x.split(':')[0] for x in problems})} failed")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
