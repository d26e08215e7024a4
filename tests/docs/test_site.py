"""The documentation site builds with warnings as errors, its generated reference covers the command
line, its internal links resolve, and its pages render in a headless browser."""

from __future__ import annotations

import argparse
import functools
import http.server
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_mkdocs = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("mkdocs", "material", "mkdocstrings")),
    reason="the docs extra is not installed (`make docs` installs it: pip install -e '.[docs]')")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
                          cwd=REPO, capture_output=True, text=True, timeout=180,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    return folder


def pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("index.html") if "assets" not in p.parts)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        for name in ("href", "src"):
            if attrs.get(name) and tag in ("a", "link", "script", "img"):
                self.links.append(attrs[name])
        self._in_title = tag == "title"

    def handle_data(self, data):
        if self._in_title:
            self.title += data

    def handle_endtag(self, tag):
        self._in_title = False


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


@needs_mkdocs
def test_every_page_of_the_nav_is_built_with_a_title(site):
    built = {p.parent.relative_to(site).as_posix() for p in pages(site)}
    for source in (REPO / "docs").rglob("*.md"):
        name = source.relative_to(REPO / "docs").with_suffix("").as_posix()
        assert ("." if name == "index" else name) in built, name
    for page in pages(site):
        assert _parsed(page).title.strip().endswith("stallscope"), page


@needs_mkdocs
def test_internal_links_and_anchors_resolve(site):
    checked = 0
    for page in pages(site) + [site / "404.html"]:
        for link in _parsed(page).links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith("mailto:"):
                continue
            base = site if parts.path.startswith("/") else page.parent  # 404.html links from the site's root
            target = (base / unquote(parts.path).lstrip("/")).resolve() if parts.path else page
            if target.is_dir():
                target = target / "index.html"
            assert target.is_file(), f"{page.relative_to(site)}: {link} -> no such file"
            if parts.fragment and target.suffix == ".html":
                assert unquote(parts.fragment) in _parsed(target).ids, f"{page.relative_to(site)}: {link}: no such anchor"
            checked += 1
    assert checked > 500


def _parsers(parser: argparse.ArgumentParser, words: tuple[str, ...] = ("stallscope",)):
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, words + (name,))


@needs_mkdocs
def test_the_cli_reference_lists_every_subcommand_and_flag(site):
    from stallscope.cli.main import build_parser

    sys.path.insert(0, str(REPO / "tools"))
    from docs_hooks import documented_actions

    text = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    commands = 0
    for words, parser in _parsers(build_parser()):
        assert f"<code>{' '.join(words)}</code>" in text, words
        commands += 1
        for action in documented_actions(parser):
            for option in action.option_strings:
                assert f"<code>{option.replace('_', '-')}</code>" in text or f"<code>{option}</code>" in text, \
                    (words, option)
    assert commands >= 15  # 11 subcommands, and the kinds of prepare, serve and storage


def test_the_knob_table_is_the_one_train_help_gives():
    """The pipeline knobs page is generated from knob_table(), the table `train --help` is built from."""
    sys.path.insert(0, str(REPO / "tools"))
    from docs_hooks import KNOB_MARKER, on_page_markdown

    from stallscope.cli.train import knob_table

    source = (REPO / "docs" / "reference" / "pipeline-knobs.md").read_text(encoding="utf-8")
    assert KNOB_MARKER in source
    assert "\n".join(knob_table()) in on_page_markdown(source)


# After load: each page fetched (its HTTP status), then shown in a frame of the same origin, and what it
# shows written into the DOM that --dump-dom prints.
_PROBE = """<!doctype html><html><body><script>
(async () => {
  const out = [];
  for (const url of %s) {
    const status = (await fetch(url)).status;
    const frame = document.createElement('iframe');
    frame.style.width = '1200px'; frame.style.height = '800px';
    await new Promise(done => { frame.onload = done; frame.src = url; document.body.appendChild(frame); });
    await new Promise(done => setTimeout(done, 50));
    const doc = frame.contentDocument, article = doc.querySelector('article');
    out.push({url, status, title: doc.title, h1: (doc.querySelector('article h1') || {}).textContent || '',
              styled: getComputedStyle(doc.querySelector('.md-header') || doc.body).position,
              height: article ? article.getBoundingClientRect().height : 0});
    frame.remove();
  }
  const pre = document.createElement('pre'); pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script></body></html>"""


@needs_mkdocs
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium; "
                                             "`make` installs it where it can), so the site cannot be rendered")
@pytest.mark.timeout(180)
def test_pages_render_in_a_headless_browser(site, tmp_path):
    urls = ["/" + p.parent.relative_to(site).as_posix().removeprefix(".") + ("/" if p.parent != site else "")
            for p in pages(site)]
    urls = [u.replace("//", "/") for u in urls] + ["/no-such-page/"]
    (site / "probe.html").write_text(_PROBE % json.dumps(urls), encoding="utf-8")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
             "--virtual-time-budget=60000", "--dump-dom", f"http://127.0.0.1:{server.server_port}/probe.html"],
            capture_output=True, text=True, timeout=150)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    match = re.search(r'<pre id="probe">(.*?)</pre>', result.stdout, re.S)
    assert match, f"the pages did not finish loading: {result.stderr[-800:]}"
    shown = {p["url"]: p for p in json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))}
    missing = shown.pop("/no-such-page/")
    assert missing["status"] == 404  # the check below would see a 404 as a failure
    assert len(shown) == len(urls) - 1
    for url, page in shown.items():
        assert page["status"] == 200, page
        assert page["title"].endswith("stallscope") and page["h1"].strip(), page
        assert page["styled"] in ("sticky", "fixed"), page  # Material's stylesheet applied to the header
        assert page["height"] > 100, page
