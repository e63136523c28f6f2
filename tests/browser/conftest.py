"""A real Chromium (Debian's chromium + chromedriver, driven by selenium) against our servers.

`.ci/run` installs both packages and sets ATTNSERVE_REQUIRE_BROWSER=1, so in CI a
missing browser fails these tests; elsewhere it skips them with the reason.
Every page load is recorded (Chrome's performance log), so a test can prove that
no request left for another host, and the browser's console errors fail the test.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ATTNSERVE_TEST_ARTIFACTS", REPO / "test-artifacts"))
PUBLIC_NAME = "attnserve.test"
# The flags the machine's notes give: no background traffic to Google's hosts, no GPU.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1000",
    # A name that is not localhost: pages (Swagger UI) behave as on a real deployment.
    f"--host-resolver-rules=MAP {PUBLIC_NAME} 127.0.0.1",
)
NETWORK_SCHEMES = ("http", "https", "ws", "wss", "ftp")
WAIT = 30.0  # seconds for a view to render: a cold server's first attention run included


def _binary(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name) or (
            f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None
        )
        if found:
            return found
    return None


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    """A fresh headless Chromium (own profile and download folder) for one test."""
    chromium, driver_path = _binary("chromium", "chromium-browser"), _binary("chromedriver")
    if chromium is None or driver_path is None:
        reason = "Debian's chromium and chromium-driver are not installed (.ci/run installs them)"
        if os.environ.get("ATTNSERVE_REQUIRE_BROWSER"):
            pytest.fail(reason)
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    # An explicit driver path: selenium never looks for (or downloads) one.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.downloads = downloads  # type: ignore[attr-defined]
    driver.sent = []  # type: ignore[attr-defined]
    driver.blocked = set()  # type: ignore[attr-defined]
    try:
        yield driver
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, f"errors in the browser's console: {errors}"
    finally:
        driver.quit()


def requested_urls(driver: webdriver.Chrome) -> list[str]:
    """Every URL the page sent a request for since the browser started (kept across calls).

    A request the browser refused before sending it (``Network.loadingFailed`` with a
    ``blockedReason``, e.g. "csp" for the page's Content-Security-Policy) never left and
    is not listed.
    """
    sent: list[tuple[str, str, str | None]] = driver.sent  # type: ignore[attr-defined]
    blocked: set[str] = driver.blocked  # type: ignore[attr-defined]
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message["method"] == "Network.requestWillBeSent":
            request = params["request"]
            sent.append((params["requestId"], request["url"], request.get("postData")))
        elif message["method"] == "Network.loadingFailed" and params.get("blockedReason"):
            blocked.add(params["requestId"])
    return [url for request_id, url, _ in sent if request_id not in blocked]


def posted_bodies(driver: webdriver.Chrome, path: str) -> list[dict]:
    """The JSON bodies the page POSTed to ``path``, in order."""
    requested_urls(driver)
    sent = driver.sent  # type: ignore[attr-defined]
    return [json.loads(body) for _, url, body in sent if body and urlsplit(url).path == path]


def assert_only_local_requests(driver: webdriver.Chrome, base_url: str) -> None:
    """Nothing left for another host: every request went to ``base_url`` or stayed in the page."""
    urls = requested_urls(driver)
    assert urls, "the performance log recorded no request at all"
    origin = urlsplit(base_url)
    # Network schemes only: data:/blob: stay in the page, chrome:// is the browser's own.
    foreign = [
        url
        for url in urls
        if urlsplit(url).scheme in NETWORK_SCHEMES
        and (urlsplit(url).scheme, urlsplit(url).netloc) != (origin.scheme, origin.netloc)
    ]
    assert not foreign, f"requests to another host: {foreign}"


def public_url(base_url: str) -> str:
    """``base_url`` under PUBLIC_NAME (same server; the browser resolves it to 127.0.0.1)."""
    return base_url.replace("127.0.0.1", PUBLIC_NAME)


def wait_for_script(driver: webdriver.Chrome, script: str, timeout: float = WAIT) -> object:
    """Wait until the JS expression ``script`` is truthy; return its value."""
    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(f"return {script}"))


def screenshot(driver: webdriver.Chrome, name: str) -> Path:
    """Keep a screenshot as a test artifact (ATTNSERVE_TEST_ARTIFACTS, else ./test-artifacts)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    assert driver.save_screenshot(str(path)), f"no screenshot written to {path}"
    assert path.stat().st_size > 10_000  # a rendered page, not an empty image
    return path
