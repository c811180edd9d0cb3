"""The paste page and /docs: served offline by a real `kb serve`, driven end to end in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from server_support import wait_ready

from api.loopback import free_port
from api.routers.web import prefers_chinese

pytestmark = pytest.mark.slow

# A ms-swift DPO run with sequence parallelism whose losses go NaN (written for this test).
PASTE = """\
swift rlhf --rlhf_type dpo --model Qwen/Qwen2.5-7B-Instruct --rpo_alpha 1.0 \\
    --sequence_parallel_size 4 --torch_dtype bfloat16
{'loss': 0.6931, 'grad_norm': 1.02, 'learning_rate': 1e-06, 'rewards/chosen': 0.0, 'epoch': 0.01}
{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-06, 'nll_loss': nan, 'rewards/chosen': nan, 'epoch': 0.02}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, repo_root):
    """`kb serve` as a user starts it, on a free loopback port, with an index built once beforehand."""
    data = tmp_path_factory.mktemp("web-data")
    env = {**os.environ, "KB_DATA_DIR": str(data), "KB_INCIDENTS_DIR": str(repo_root / "incidents"),
           "PYTHONPATH": str(repo_root)}
    subprocess.run([sys.executable, "-m", "kb.cli", "-q", "index"], env=env, check=True, timeout=600,
                   capture_output=True)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kb.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "warning"], env=env, cwd=repo_root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_accept_language_choice():
    assert prefers_chinese("zh-CN,zh;q=0.9,en;q=0.8")
    assert prefers_chinese("en;q=0.5, zh-TW")
    assert not prefers_chinese("en-US,en;q=0.9,zh-CN;q=0.8")
    assert not prefers_chinese("")


def _local_refs(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="([^"]+)"', html)


def test_page_and_docs_need_no_internet(server):
    page = httpx.get(server + "/", headers={"Accept-Language": "zh-CN,zh;q=0.9"})
    assert page.status_code == 200 and 'data-lang="zh"' in page.text
    assert 'data-lang="en"' in httpx.get(server + "/", headers={"Accept-Language": "en-GB"}).text
    docs = httpx.get(server + "/docs")
    assert docs.status_code == 200
    for html in (page.text, docs.text):
        refs = _local_refs(html)
        assert refs and all(r.startswith("/") for r in refs), refs  # nothing from another host
        for r in refs:
            assert httpx.get(server + r).status_code == 200, r
    assert "/assets/swagger/swagger-ui-bundle.js" in docs.text
    js = httpx.get(server + "/static/app.js").text
    assert "http://" not in js and "https://" not in js


def _chrome():
    webdriver = pytest.importorskip("selenium.webdriver")
    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if not (binary and driver):
        pytest.skip("no chromium + chromedriver (apt-get install -y chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    def start(lang: str):
        opts = webdriver.ChromeOptions()
        opts.binary_location = binary
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--window-size=1200,1500", f"--lang={lang}", "--no-proxy-server"):
            opts.add_argument(a)
        opts.add_experimental_option("prefs", {"intl.accept_languages": lang})
        return webdriver.Chrome(service=Service(driver), options=opts)

    return start


def _wait(drv, css: str, timeout: float = 120.0):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(drv, timeout).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))


def _paste_and_submit(drv, text: str) -> None:
    from selenium.webdriver.common.by import By

    box = drv.find_element(By.ID, "paste")
    box.clear()
    box.send_keys(text)
    drv.find_element(By.ID, "submit").click()


def test_paste_submit_read_the_result_in_chromium(server, repo_root):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # What the API says about this paste; the page must show exactly that (ranking is tested elsewhere).
    want = httpx.post(server + "/v1/diagnose?k=3", content=PASTE.encode(), timeout=120,
                      headers={"content-type": "text/plain"}).json()
    assert want["diagnoses"], want
    top = want["diagnoses"][0]
    lead = want["diagnoses"] if want["abstained"] else want["diagnoses"][:1]
    marked = {f"L{e['line']}" for d in lead for e in d["evidence"] if e.get("line") and e["source"] == "text"}
    drv = _chrome()("en-US")
    try:
        drv.get(server + "/")
        _wait(drv, "body[data-ready='1']")
        assert drv.find_element(By.TAG_NAME, "h1").text.startswith("kb")
        _paste_and_submit(drv, PASTE)
        first = _wait(drv, "#diagnoses .diagnosis")
        cards = drv.find_elements(By.CSS_SELECTOR, "#diagnoses .diagnosis")
        assert [c.get_attribute("data-category") for c in cards] == [d["category"] for d in want["diagnoses"]]
        assert first.get_attribute("data-incident") == top["incident_id"]
        if top["fix"]:
            assert "Fix:" in first.text and top["fix"][:40] in first.text
        if top["repro"]:
            assert first.find_element(By.CSS_SELECTOR, ".repro").text == top["repro"]
        summary = drv.find_element(By.ID, "summary").text
        if want["abstained"]:
            assert summary.startswith("No confident diagnosis")
        else:
            assert summary.startswith("Most likely cause") and top["category"] in summary
        rec = want.get("track_record")  # the shipped case base measures it; the page quotes it as the API gives it
        assert rec, "the shipped learned.json carries the out-of-fold track record"
        track = drv.find_element(By.ID, "track").text
        assert f"({rec['band']}) were right {rec['percent']}%" in track and f"of {rec['of']} " in track
        # Evidence lines are marked in the paste, and only those.
        lines = drv.find_elements(By.CSS_SELECTOR, "#lines li")
        assert len(lines) == len(PASTE.rstrip("\n").split("\n"))
        hit_ids = {h.get_attribute("id") for h in drv.find_elements(By.CSS_SELECTOR, "#lines li.hit")}
        assert hit_ids == marked and hit_ids, (hit_ids, marked)
        questions = drv.find_elements(By.CSS_SELECTOR, "#question-list li .q")
        assert [q.text for q in questions] == [q["question"] for q in want.get("questions", [])]
        shot = os.environ.get("KB_WEB_SCREENSHOT")
        if shot:  # `KB_WEB_SCREENSHOT=docs/web.png pytest tests/test_web.py` refreshes the README's picture
            drv.execute_script("window.scrollTo(0, 0)")
            drv.save_screenshot(str(Path(shot)))
        # A cause with no curated incident for this paste: its card names none (no empty "incident:" label).
        bare = "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.01}"
        want = httpx.post(server + "/v1/diagnose?k=3", content=bare.encode(), timeout=120,
                          headers={"content-type": "text/plain"}).json()
        bare_ids = [d["incident_id"] for d in want["diagnoses"]]
        assert "" in bare_ids
        _paste_and_submit(drv, bare)
        WebDriverWait(drv, 120, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: [c.get_attribute("data-incident")
                       for c in d.find_elements(By.CSS_SELECTOR, "#diagnoses .diagnosis")] == bare_ids)
        cards = drv.find_elements(By.CSS_SELECTOR, "#diagnoses .diagnosis")
        for card, iid in zip(cards, bare_ids):
            meta = card.find_element(By.CSS_SELECTOR, ".meta").text
            assert ("incident:" in meta) == bool(iid) and (iid in meta if iid else True)
    finally:
        drv.quit()


# A first post with no log and no metric (written for this test): kb calls it out of scope and asks the scope question.
VAGUE = ("Qwen3 SFT with ZeRO++ (zero_hpz_partition_size 4): after resuming from a checkpoint the training curve "
         "looks wrong, see screenshot")


def _api(server: str, answers: dict) -> dict:
    """What the API answers for VAGUE with these answers: the page must show the same."""
    r = httpx.post(server + "/v1/diagnose", json={"text": VAGUE, "k": 3, "facts": answers}, timeout=120,
                   headers={"accept-language": "en-US"})
    assert r.status_code == 200, r.text
    return r.json()


def _shows(drv, want: dict, answers: dict) -> bool:
    from selenium.webdriver.common.by import By

    cards = [c.get_attribute("data-category") for c in drv.find_elements(By.CSS_SELECTOR, "#diagnoses .diagnosis")]
    asked = [q.get_attribute("data-fact") for q in drv.find_elements(By.CSS_SELECTOR, "#question-list li")]
    said = [a.get_attribute("data-fact") for a in drv.find_elements(By.CSS_SELECTOR, "#answer-list li")]
    return (cards == [d["category"] for d in want["diagnoses"]]
            and asked == [q["fact"] for q in want.get("questions") or []] and said == list(answers)
            and not drv.find_element(By.ID, "submit").get_property("disabled"))


def test_questions_are_answered_in_place_and_each_answer_reranks(server):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    def until(want, answers):
        WebDriverWait(drv, 120, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: _shows(d, want, answers))

    alone = _api(server, {})
    assert alone["abstained"] and [q["fact"] for q in alone["questions"]] == ["symptom"], alone
    nan = _api(server, {"symptom": "nan"})
    assert not nan["abstained"] and nan["diagnoses"][0]["category"] == "framework-bug", nan
    open_q = next(q["fact"] for q in nan["questions"] if not q["options"])  # e.g. framework_version: typed in
    both = _api(server, {"symptom": "nan", open_q: "0.16.4"})
    drv = _chrome()("en-US")
    try:
        drv.get(server + "/")
        _wait(drv, "body[data-ready='1']")
        _paste_and_submit(drv, VAGUE)
        until(alone, {})
        assert drv.find_element(By.ID, "answered").get_attribute("hidden") is not None  # nothing answered yet
        options = drv.find_elements(By.CSS_SELECTOR, "#question-list li[data-fact='symptom'] button.answer")
        assert [b.text for b in options] == alone["questions"][0]["options"]
        drv.find_element(By.CSS_SELECTOR, "#question-list li[data-fact='symptom'] button[data-value='nan']").click()
        until(nan, {"symptom": "nan"})
        assert "symptom = nan" in drv.find_element(By.ID, "answer-list").text
        assert drv.find_element(By.ID, "summary").text.startswith("Most likely cause")
        box = drv.find_element(By.CSS_SELECTOR, f"#question-list li[data-fact='{open_q}'] input.answer-text")
        box.send_keys("0.16.4", Keys.ENTER)  # an open question: typed, Enter answers it
        until(both, {"symptom": "nan", open_q: "0.16.4"})
        # A refused answer (a word the scope question does not take) leaves the result as it was, with the error.
        drv.execute_script("answer('symptom', 'weird')")
        WebDriverWait(drv, 60).until(lambda d: "Error" in d.find_element(By.ID, "status").text)
        assert "symptom" in drv.find_element(By.ID, "status").text
        until(both, {"symptom": "nan", open_q: "0.16.4"})
        # Taking an answer back re-ranks without it.
        drv.find_element(By.CSS_SELECTOR, "#answer-list li[data-fact='symptom'] button.remove").click()
        until(_api(server, {open_q: "0.16.4"}), {open_q: "0.16.4"})
        # Diagnosing a paste anew starts over: no answer is carried to it.
        drv.find_element(By.ID, "submit").click()
        until(alone, {})
        assert drv.find_element(By.ID, "answered").get_attribute("hidden") is not None
    finally:
        drv.quit()


def test_page_follows_a_chinese_browser_and_reports_bad_input(server):
    from selenium.webdriver.common.by import By

    drv = _chrome()("zh-CN")
    try:
        drv.get(server + "/")
        _wait(drv, "body[data-ready='1']")
        assert drv.find_element(By.ID, "submit").text == "诊断"
        assert "NaN" in drv.find_element(By.TAG_NAME, "h1").text and "为什么" in drv.title
        drv.find_element(By.ID, "submit").click()  # nothing pasted: a message, no request
        assert "请先粘贴" in drv.find_element(By.ID, "status").text
        _paste_and_submit(drv, "KTO 训练时 loss 变成 nan，batch 里只有 desirable 样本\n")
        _wait(drv, "#summary strong")
        body = drv.find_element(By.ID, "result").text
        assert "置信度" in body or "无法给出可靠诊断" in body
    finally:
        drv.quit()


def test_docs_render_offline_in_chromium(server):
    drv = _chrome()("en-US")
    try:
        drv.get(server + "/docs")
        op = _wait(drv, ".opblock", timeout=60)  # Swagger UI ran: its JS came from this server
        assert op.is_displayed()
        assert "/v1/diagnose" in drv.page_source and "/retrieval" in drv.page_source
    finally:
        drv.quit()


def test_api_sources_are_links_never_seed_file_names(server, repo_root):
    """Five seed incidents cite an article file; the API lists only links."""
    seeded = [p.parent.name for p in (repo_root / "incidents").glob("*/incident.md")
              if re.search(r"^- file: ", p.read_text(encoding="utf-8"), re.MULTILINE)]
    assert seeded
    seen = set()
    for q in ("KTO loss nan OpenRLHF vanilla", "DPO NLL loss nan sequence parallel", "SimPO empty response nan",
              "reward model LoRA fp16 nan", "xtuner internlm2 fp16 overflow", "loss nan"):
        res = httpx.post(server + "/v1/ask", json={"question": q, "k": 10}, timeout=120).json()
        for r in res["results"]:
            seen.add(r["id"])
            assert all(s.startswith(("https://", "http://")) for s in r["sources"]), r
    assert seen & set(seeded)
