"""Make docs/img/viewer.png, the README's picture of the viewer, from the current page.

    .venv/bin/python -m tests.browser.readme_screenshot http://127.0.0.1:8000 docs/img/viewer.png

against a server on minilm-l6 (``make serve``): Debian's chromium and chromedriver,
headless with the flags of the browser tests, the page as a deep link opens it.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from urllib.parse import urlencode

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from tests.browser.conftest import CHROMIUM_FLAGS, _binary, wait_for_script
from tests.browser.test_viewer import RENDERED

VIEW = {
    "text": "The animal didn't cross the street because it was too tired.",
    "model": "minilm-l6",
    "layer": "2",
    "head": "8",
    "view": "head",
}
WIDTH = 1280


def main(base_url: str, out: Path) -> None:
    chromium, driver_path = _binary("chromium", "chromium-browser"), _binary("chromedriver")
    assert chromium and driver_path, "needs Debian's chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    with tempfile.TemporaryDirectory() as profile:
        options.add_argument(f"--user-data-dir={profile}")
        driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
        try:
            driver.get(f"{base_url}/viewer?{urlencode(VIEW)}")
            wait_for_script(driver, RENDERED)
            # The whole page at WIDTH CSS pixels, however tall it is now (no scroll bar).
            height = driver.execute_script("return document.documentElement.scrollHeight")
            metrics = {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
            wait_for_script(driver, RENDERED)
            assert driver.save_screenshot(str(out)), f"no screenshot written to {out}"
        finally:
            driver.quit()


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"), Path(sys.argv[2]))
