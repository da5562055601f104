"""The web page (`ollie srv start --web`), in a real headless Chromium driven by Selenium with
Debian's chromium-driver (./setup.sh --test installs both), against a real file server with
scripted agents. The checks of issue 27's "done when", one test each; the screenshots in docs/
are taken here (OLLIE_WEB_SCREENSHOTS=1 writes them)."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from fs_helpers import ROOT, FsServer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
WAIT = 20.0

DIFF = "printf 'tool-output-42\\n'; printf -- '--- a/x.py\\n+++ b/x.py\\n@@ -1 +1 @@\\n-old line\\n+new line\\n'"
TOOL_TURNS = [
    {
        "reasoning": "The user wants a listing.\nI will run a command.",
        "tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": DIFF}]}}],
    },
    {"text": "The command said **tool-output-42**.\n\n- one\n- two", "chunk": 4, "delay": 0.6},
]
XSS = (
    'look: <img src=x onerror="window.__pwned=1"> and <script>window.__pwned=2</script> '
    "and [a link](javascript:window.__pwned=3) done"
)


def _browser_or_skip():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (./setup.sh --test installs it, with the dev extra)")
    if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        pytest.skip("Debian's chromium and chromium-driver are not installed (./setup.sh --test installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-proxy-server",
        "--window-size=1280,860",
        "--disable-extensions",
        "--no-first-run",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    srv = FsServer(tmp_path_factory.mktemp("web"))
    srv.agent("default", [{"match": ".", "text": "ok, done"}])
    srv.agent("tooler", turns=TOOL_TURNS)
    srv.agent("slow", turns=[{"text": "too late", "delay": 60}])
    srv.agent("xss", [{"match": ".", "text": XSS}])
    srv.agent("queue", turns=[{"text": "first answer", "delay": 1}, {"text": "second answer"}])
    srv.agent("judge", [{"match": ".", "text": "2\nThe second says it better."}])
    spawn = (
        "echo 'new agent=default name=kid' > $OLLIE/ctl && "
        "printf 'agent=default\\nname=j\\n---\\nhello\\n' > $OLLIE/b/new"
    )
    srv.agent(
        "parent",
        turns=[
            {"tool_calls": [{"name": "execute_code", "arguments": {"steps": [{"code": spawn}]}}]},
            {"text": "spawned"},
        ],
        subagents=["default"],
    )
    out = srv.ollie("srv", "start", "--web", "127.0.0.1:0", check=False)
    assert out.returncode == 0, out.stderr + srv.log()
    try:
        srv.url = (srv.root / "ns" / "ollie.web").read_text().strip()
        assert srv.url in out.stdout
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def browser(web):
    driver = _browser_or_skip()
    try:
        driver.set_page_load_timeout(WAIT)
        driver.get(web.url)  # the token, once: a cookie from then on
        yield driver
    finally:
        driver.quit()


def until(check, timeout: float = WAIT, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except Exception:  # an element not there yet, or gone stale while the page redraws
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {(what() if callable(what) else what) or check}"
        time.sleep(0.05)


def by_id(driver, eid):
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, eid)


def css(driver, sel):
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, sel)


def shot(driver, name: str) -> None:
    if os.environ.get("OLLIE_WEB_SCREENSHOTS"):
        driver.save_screenshot(str(ROOT / "docs" / name))


def request(web, method: str, path: str, headers: dict[str, str] | None = None, body: str | None = None, stream=False):
    u = urlsplit(web.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), "" if stream else r.read().decode()
    finally:
        conn.close()


# ---- refusals (plain HTTP: what a browser would send, and what it would not) ------------------------
def test_requests_without_token_foreign_host_or_origin_are_refused(web):
    u = urlsplit(web.url)
    host = f"{u.hostname}:{u.port}"
    token = u.query.removeprefix("token=")
    status, headers, _ = request(web, "GET", "/?" + u.query)
    assert status == 303 and headers["location"] == "/"
    cookie = headers["set-cookie"].split(";")[0]
    assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
    assert "script-src 'self'" in headers["content-security-policy"]

    status, headers, _ = request(web, "GET", "//evil.example/?" + u.query)  # the redirect stays here
    assert status == 303 and headers["location"] == "/evil.example/"
    assert request(web, "GET", "/api/meta")[0] == 401  # no token, no cookie
    assert cookie.startswith(f"ollie_web_{u.port}=")  # one per server: the browser's jar is per host, not port
    assert request(web, "GET", "/api/meta", {"Cookie": f"ollie_web_{u.port}=forged"})[0] == 401
    assert request(web, "GET", "/api/meta", {"Cookie": cookie.replace(f"_{u.port}=", "_1=")})[0] == 401
    assert request(web, "GET", "/?token=wrong" + token[:4])[0] == 401
    status, headers, body = request(web, "GET", "/api/meta", {"Cookie": cookie})
    assert status == 200 and '"default"' in body
    assert "default-src 'none'" in headers["content-security-policy"] and headers["x-frame-options"] == "DENY"
    # DNS rebinding: another name for our address, with a valid cookie even
    status, _, body = request(web, "GET", "/api/meta", {"Cookie": cookie, "Host": f"evil.example:{u.port}"})
    assert status == 403 and "Host" in body
    assert request(web, "GET", "/?" + u.query, {"Host": "evil.example"})[0] == 403
    # a cross-site request: a foreign Origin, or a change that says no Origin at all
    new = json.dumps({"cwd": str(web.work)})
    before = sorted(os.listdir(web.mnt / "s"))
    status, _, body = request(web, "POST", "/api/s/new", {"Cookie": cookie, "Origin": "http://evil.example"}, new)
    assert status == 403 and "origin" in body
    assert request(web, "POST", "/api/s/new", {"Cookie": cookie}, new)[0] == 403
    status, _, _ = request(
        web, "GET", "/events/sessions", {"Cookie": cookie, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}
    )
    assert status == 403
    upgrade = {
        "Cookie": cookie,
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    # another site's page opening the live stream (cross-site WebSocket hijacking), or none saying who
    assert request(web, "GET", "/ws/sessions", {**upgrade, "Origin": "http://evil.example"})[0] == 403
    assert request(web, "GET", "/ws/sessions", upgrade)[0] == 403
    assert request(web, "GET", "/ws/sessions", {**upgrade, "Origin": f"http://{host}", "Cookie": "x=y"})[0] == 403
    assert request(web, "GET", "/ws/sessions", {**upgrade, "Origin": f"http://{host}"}, stream=True)[0] == 101
    assert sorted(os.listdir(web.mnt / "s")) == before  # nothing was made
    status, _, body = request(web, "POST", "/api/s/new", {"Cookie": cookie, "Origin": f"http://{host}"}, new)
    assert status == 200, body


# ---- in the browser ---------------------------------------------------------------------------------
def test_opens_with_the_token_and_a_session_made_through_the_mount_appears_live(web, browser):
    browser.get(web.url.split("?")[0] + "#/")  # the cookie, no token: the redirect dropped it
    assert "token=" not in browser.current_url
    until(lambda: "live" in by_id(browser, "status").text, what="the table's stream")
    sid = web.new_session(agent="default")  # a script, through the mount
    row = until(lambda: [tr for tr in css(browser, "#sessions tbody tr") if sid in tr.text], what=f"row {sid}")[0]
    assert "default" in row.text and "idle" in row.text
    (web.mnt / "s" / sid / "prompt").write_text("list the files please")  # its row follows
    until(lambda: "list the files please" in row.text, what="the row's last prompt")
    more = [web.new_session(agent=agent) for agent in ("tooler", "default", "slow")]
    until(lambda: all(any(m in tr.text for tr in css(browser, "#sessions tbody tr")) for m in more), what="more rows")
    (web.mnt / "s" / more[-1] / "prompt").write_text("a long one")  # its state changes in the table
    until(lambda: [tr for tr in css(browser, "#sessions tbody tr") if more[-1] in tr.text and "thinking" in tr.text])
    shot(browser, "web-sessions.png")
    (web.mnt / "s" / more[-1] / "ctl").write_text("stop\n")
    until(lambda: [tr for tr in css(browser, "#sessions tbody tr") if more[-1] in tr.text and "idle" in tr.text])


def test_a_turn_streams_with_its_tool_call_and_a_typed_prompt_reaches_the_session(web, browser):
    from selenium.webdriver.common.keys import Keys

    sid = web.new_session(agent="tooler")
    browser.get(web.url.split("?")[0] + f"#/s/{sid}")
    until(lambda: by_id(browser, "state").text == "idle", what="the page's info")
    box = by_id(browser, "prompt")
    box.send_keys("what is here?", Keys.SHIFT, Keys.ENTER, Keys.SHIFT, "second line", Keys.ENTER)
    chat = by_id(browser, "chat")
    until(lambda: css(browser, "#chat details.call"), what="the tool call")
    # live: the call shows while the turn runs, before the answer (the model takes 0.6 s for it)
    assert "tool-output-42." not in chat.text and by_id(browser, "state").text != "idle"
    until(lambda: "tool-output-42." in chat.text, what="the streamed answer")
    assert (web.mnt / "s" / sid / "prompt.prev").read_text().strip() == "what is here?\nsecond line"
    assert "user: what is here?\n" in (web.mnt / "s" / sid / "chat").read_text()
    call = css(browser, "#chat details.call")[0]
    assert "execute_code" in call.text and call.get_attribute("open") is None  # folded
    call.find_element("tag name", "summary").click()
    until(lambda: "tool-output-42" in call.find_element("css selector", "pre.out").text, what="the tool's output")
    assert [x.text for x in call.find_elements("css selector", "pre.out span.del")] == ["-old line"]  # a diff, coloured
    assert [x.text for x in call.find_elements("css selector", "pre.out span.add")] == ["+new line"]
    reasoning = css(browser, "#chat details.reasoning")[0]
    reasoning.find_element("tag name", "summary").click()
    assert "I will run a command." in reasoning.text
    assert css(browser, "#chat .md strong")[0].text == "tool-output-42"  # markdown rendered
    assert [li.text for li in css(browser, "#chat .md li")] == ["one", "two"]
    until(lambda: by_id(browser, "state").text == "idle", what="idle after the turn")
    assert box.get_attribute("value") == ""
    shot(browser, "web-session.png")


def test_slash_commands_are_offered_and_run_as_in_prompt(web, browser):
    from selenium.webdriver.common.keys import Keys

    sid = web.new_session(agent="default")
    browser.get(web.url.split("?")[0] + f"#/s/{sid}")
    until(lambda: by_id(browser, "state").text == "idle", what="the page's info")
    by_id(browser, "prompt").send_keys("/co")
    hints = until(lambda: [b.text for b in css(browser, "#hints button")], what="the commands offered")
    assert "/compact" in hints and "/stop" not in hints
    by_id(browser, "prompt").send_keys(*[Keys.BACKSPACE] * 3, "/set temperature 0.25\n")
    until(
        lambda: "temperature=0.25" in (web.mnt / "s" / sid / "cfg").read_text(),
        what=lambda: (web.mnt / "s" / sid / "cfg").read_text() + (web.mnt / "s" / sid / "chat").read_text(),
    )


def test_a_prompt_sent_during_a_turn_queues(web, browser):
    sid = web.new_session(agent="queue")
    browser.get(web.url.split("?")[0] + f"#/s/{sid}")
    until(lambda: by_id(browser, "state").text == "idle", what="the page's info")
    by_id(browser, "prompt").send_keys("one\n")
    until(lambda: by_id(browser, "state").text == "thinking", what="the turn to start")
    by_id(browser, "prompt").send_keys("two\n")
    chat = by_id(browser, "chat")
    until(lambda: "second answer" in chat.text, what="the queued prompt's answer")
    text = chat.text
    assert ":: queued: two" in text  # the chat says so, and it runs after the first
    assert text.index("first answer") < text.index("\ntwo\n") < text.index("second answer")


def test_stop_interrupts_the_turn(web, browser):
    sid = web.new_session(agent="slow")
    browser.get(web.url.split("?")[0] + f"#/s/{sid}")
    until(lambda: by_id(browser, "state").text == "idle", what="the page's info")
    by_id(browser, "prompt").send_keys("take your time\n")
    until(lambda: by_id(browser, "state").text == "thinking", what="the turn to start")
    by_id(browser, "stop").click()
    until(lambda: by_id(browser, "state").text == "idle", timeout=10, what="the turn to stop")
    assert (web.mnt / "s" / sid / "state").read_text().strip() == "idle"
    assert "too late" not in (web.mnt / "s" / sid / "chat").read_text()


def test_a_job_submitted_in_the_page_shows_up_in_b(web, browser):
    browser.get(web.url.split("?")[0] + "#/b")
    spec = until(lambda: by_id(browser, "spec"), what="the spec box")
    template = (web.mnt / "b" / "new").read_text()  # what the page offers is the file's template
    until(lambda: spec.get_attribute("value") == template, what="the template")
    spec.clear()
    spec.send_keys(f"name=webjob\ncwd={web.work}\nagent=default\n---\nsummarise nothing")
    by_id(browser, "submit-job").click()
    answer = until(lambda: by_id(browser, "submitted").text.startswith("made"), what="the job's id") and by_id(
        browser, "submitted"
    )
    jid = answer.text.split()[-1]
    assert jid in os.listdir(web.mnt / "b")
    row = until(lambda: [tr for tr in css(browser, "#jobs tbody tr") if jid in tr.text], what="its row")[0]
    until(lambda: "done" in row.text, what="the job to finish")
    assert (web.mnt / "b" / jid / "result").read_text().strip() == "ok, done"
    browser.get(web.url.split("?")[0] + f"#/b/{jid}")  # its page: the spec, the result, the log
    until(lambda: by_id(browser, "state").text == "done", what="the job's page")
    assert "summarise nothing" in by_id(browser, "plan").text and "ok, done" in by_id(browser, "facts").text
    until(lambda: "ok, done" in by_id(browser, "chat").text and "summarise nothing" in by_id(browser, "chat").text)


def test_model_output_with_markup_is_text_and_runs_nothing(web, browser):
    sid = web.new_session(agent="xss")
    browser.get(web.url.split("?")[0] + f"#/s/{sid}")
    until(lambda: by_id(browser, "state").text == "idle", what="the page's info")
    by_id(browser, "prompt").send_keys("<b>bold?</b> <img src=y onerror=window.__pwned=4>\n")
    chat = by_id(browser, "chat")
    until(lambda: "done" in chat.text and "<script>" in chat.text, what="the answer, as text")
    assert "<img src=x onerror=" in chat.text and "<b>bold?</b>" in chat.text
    assert css(browser, "#chat img, #chat script, #chat b") == []
    assert not [a for a in css(browser, "#chat a") if "javascript" in (a.get_attribute("href") or "")]
    time.sleep(0.3)  # an onerror would have fired by now
    assert browser.execute_script("return window.__pwned === undefined")
    browser.get(web.url.split("?")[0] + "#/")  # the table shows the last prompt: as text too
    row = until(lambda: [tr for tr in css(browser, "#sessions tbody tr") if sid in tr.text], what="its row")[0]
    until(lambda: "<b>bold?</b>" in row.text, what="the prompt, as text")
    assert browser.execute_script("return window.__pwned === undefined")
    logs = [e for e in browser.get_log("browser") if "Content Security Policy" in e.get("message", "")]
    assert logs == []  # nothing the page does itself was refused by its own policy


def test_memory_search_read_and_remove(web, browser):
    memory = web.data / "memory"
    memory.mkdir(exist_ok=True)
    (memory / "20260101T000000Z--cats__pets.md").write_text("# Cats\ntags: pets\n\nCats purr <i>loudly</i>.\n")
    browser.get(web.url.split("?")[0] + "#/m")
    q = until(lambda: by_id(browser, "memq"), what="the search box")
    q.send_keys("purr\n")
    # Its text read in the same look: a search redraws the list, and an element found before is stale.
    texts = until(lambda: [c.text for c in css(browser, "#memories .card") if "cats__pets" in c.text], what="the card")
    assert "<i>loudly</i>" in texts[0]
    browser.execute_script("window.confirm = () => true")

    def remove() -> bool:  # the list is redrawn by each search: find the card anew until a click lands
        card = [c for c in css(browser, "#memories .card") if "cats__pets" in c.text][0]
        [b for b in card.find_elements("tag name", "button") if b.text == "remove"][0].click()
        return True

    until(remove, what="a click on remove")
    until(lambda: not (memory / "20260101T000000Z--cats__pets.md").exists(), what="the memory's removal")


def test_refused_changes_say_why(web):
    """The same refusals as the files': a model switch during a turn is refused, busy."""
    u = urlsplit(web.url)
    status, headers, _ = request(web, "GET", "/?" + u.query)
    cookie = headers["set-cookie"].split(";")[0]
    sid = web.new_session(agent="slow")
    (web.mnt / "s" / sid / "prompt").write_text("wait")
    until(lambda: (web.mnt / "s" / sid / "state").read_text().strip() == "thinking", what="the turn")
    hdrs = {"Cookie": cookie, "Origin": f"http://{u.hostname}:{u.port}", "Content-Type": "application/json"}
    status, _, body = request(web, "POST", f"/api/s/{sid}/ctl", hdrs, '{"line": "model other"}')
    assert status == 409 and "turn" in body
    assert request(web, "POST", f"/api/s/{sid}/ctl", hdrs, '{"line": "stop"}')[0] == 200
    assert request(web, "POST", "/api/s/no-such/prompt", hdrs, '{"text": "hi"}')[0] == 404


def test_loopback_only_without_a_token_file(web, tmp_path):
    out = web.ollie("srv", "start", "--no-mount", "--socket", str(tmp_path / "x"), "--web", "0.0.0.0:0", check=False)
    assert out.returncode != 0 and "--web-token-file" in out.stderr
    assert not Path(tmp_path / "x.pid").exists()


def test_a_port_another_program_holds_is_said_in_words_with_the_way_out(web, tmp_path):
    taken = web.url.split("//")[1].split("/")[0]  # the running server's page holds it
    out = web.ollie("srv", "start", "--no-mount", "--socket", str(tmp_path / "x"), "--web", taken, check=False)
    assert out.returncode != 0
    assert f"the web page cannot listen on {taken}: another program does" in out.stderr
    assert "ollie web --addr" in out.stderr and "Errno" not in out.stderr
    assert not Path(tmp_path / "x.pid").exists()


def test_a_token_from_the_environment_is_held_to_a_token_files_length(monkeypatch):
    """`srv start` hands the token to its server in $OLLIE_WEB_TOKEN, which a service's unit may set
    too: a short one opened the page to the network, where a file's is refused under 16 characters."""
    import argparse

    from ollie.cli.srv import web_token
    from ollie.types import ConfigError

    no_file = argparse.Namespace(web_token_file=None)
    monkeypatch.setenv("OLLIE_WEB_TOKEN", "abc")
    for host in ("0.0.0.0", "127.0.0.1"):
        with pytest.raises(ConfigError, match="OLLIE_WEB_TOKEN: a web token must be 16 characters at least"):
            web_token(no_file, host)
    monkeypatch.setenv("OLLIE_WEB_TOKEN", "k" * 32)
    assert web_token(no_file, "0.0.0.0") == "k" * 32
    monkeypatch.delenv("OLLIE_WEB_TOKEN")
    assert web_token(no_file, "127.0.0.1") == ""  # generated
    with pytest.raises(ConfigError, match="--web-token-file"):
        web_token(no_file, "0.0.0.0")


def test_candidates_and_the_judges_pick_side_by_side(web, browser):
    """u/optimize's shape: jobs <name>-0, <name>-1 and a judge <name>-judge-0 naming one."""
    for spec in (
        f"name=opt-t\ncwd={web.work}\nparallel=2\n---\nname it\n",
        f"name=opt-t-judge\ncwd={web.work}\nagent=judge\n---\npick\n",
    ):
        (web.mnt / "b" / "new").write_text(spec)
    for jid in ("opt-t-0", "opt-t-1", "opt-t-judge-0"):
        until(lambda jid=jid: (web.mnt / "b" / jid / "status").read_text().strip() == "done", what=jid)
    browser.get(web.url.split("?")[0] + "#/b")
    until(lambda: len([tr for tr in css(browser, "#jobs tbody tr") if "opt-t" in tr.text]) == 3, what="the rows")
    by_id(browser, "compare-name").send_keys("opt-t")
    by_id(browser, "compare").click()
    cards = until(lambda: css(browser, "#cards .card[data-id]"), what="the candidates")
    assert [c.get_attribute("data-id") for c in cards] == ["opt-t-0", "opt-t-1"]
    assert "pick" in cards[1].get_attribute("class") and "pick" not in cards[0].get_attribute("class")
    assert "The second says it better." in css(browser, "#cards .judge")[0].text


def test_the_new_session_button_makes_one_through_ctl(web, browser):
    browser.get(web.url.split("?")[0] + "#/")
    until(lambda: by_id(browser, "new-agent").find_elements("tag name", "option"), what="the agents")
    from selenium.webdriver.support.ui import Select

    Select(by_id(browser, "new-agent")).select_by_value("tooler")
    backend = Select(by_id(browser, "new-backend"))
    values = [o.get_attribute("value") for o in backend.options]
    assert values[0] == "" and backend.options[0].text == "the agent's backend"
    assert {"scripted", "local"} <= set(values)
    assert len([o for o in backend.options if o.text.endswith(" (default)")]) == 1
    backend.select_by_value("local")  # not the agent's: the form's choice reaches the session
    cwd = by_id(browser, "new-cwd")
    cwd.clear()
    cwd.send_keys(str(web.work))
    before = set(os.listdir(web.mnt / "s"))
    by_id(browser, "new-session").click()
    until(lambda: "#/s/" in browser.current_url, what="the new session's page")
    sid = browser.current_url.rsplit("/", 1)[1]
    assert sid in set(os.listdir(web.mnt / "s")) - before
    cfg = (web.mnt / "s" / sid / "cfg").read_text().splitlines()
    assert "agent=tooler" in cfg and "backend=local" in cfg
    until(lambda: by_id(browser, "state").text == "idle", what="its page")
    browser.get(web.url.split("?")[0] + "#/")  # and its row's end button ends it
    browser.execute_script("window.confirm = () => true")

    def end() -> bool:
        row = [tr for tr in css(browser, "#sessions tbody tr") if sid in tr.text][0]
        row.find_element("css selector", "button.danger").click()
        return True

    until(end, what="a click on end")
    until(lambda: not [tr for tr in css(browser, "#sessions tbody tr") if sid in tr.text], what="its row to go")
    assert sid not in os.listdir(web.mnt / "s") and sid in os.listdir(web.mnt / "tr")


def test_ollie_web_prints_the_running_servers_address(web):
    out = web.ollie("web")
    assert out.stdout.strip() == web.url


def test_a_sessions_sub_sessions_and_jobs_open_from_its_tree(web, browser):
    sid = web.new_session(agent="parent")
    browser.get(web.url.split("?")[0] + f"#/s/{sid}")
    until(lambda: by_id(browser, "state").text == "idle", what="the page's info")
    (web.mnt / "s" / sid / "prompt").write_text("spawn")
    # the tree is redrawn as its entries change state: read it, and click in it, afresh each time
    until(lambda: sorted(a.text for a in css(browser, "#tree a")) == [f"{sid}.j-0", f"{sid}.kid"], what="the tree")
    until(lambda: "spawned" in by_id(browser, "chat").text, what="the answer")

    def open_kid() -> bool:
        [a for a in css(browser, "#tree a") if a.text == f"{sid}.kid"][0].click()
        return True

    until(open_kid, what="a click on the sub-session")
    until(lambda: browser.current_url.endswith(f"#/s/{sid}.kid"), what="the sub-session's page")
    until(lambda: [a for a in css(browser, "#facts a") if a.text == sid], what="its parent's link")
