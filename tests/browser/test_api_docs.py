"""/docs and /redoc render in a real browser with no internet: nothing loads from a CDN."""

from __future__ import annotations

from selenium import webdriver
from selenium.webdriver.common.by import By

from tests.browser.conftest import (
    assert_only_local_requests,
    public_url,
    screenshot,
    wait_for_script,
)


def test_swagger_ui_renders_every_operation_from_local_files(
    browser: webdriver.Chrome, server_url: str
) -> None:
    # Under a non-localhost name, where Swagger UI would ask validator.swagger.io for a badge.
    url = public_url(server_url)
    browser.get(f"{url}/docs")
    wait_for_script(browser, "document.querySelectorAll('.opblock').length > 5")
    assert "attnserve" in browser.find_element(By.CSS_SELECTOR, ".info .title").text
    paths = {e.text for e in browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")}
    assert {"/v1/encode", "/v1/embeddings", "/v2/models/{model}/infer"} <= paths
    screenshot(browser, "api-docs-swagger")
    assert_only_local_requests(browser, url)


def test_redoc_renders_from_local_files(browser: webdriver.Chrome, server_url: str) -> None:
    url = public_url(server_url)
    browser.get(f"{url}/redoc")
    wait_for_script(
        browser, "document.querySelectorAll('[data-section-id^=\"operation/\"]').length > 5"
    )
    assert "attnserve" in browser.find_element(By.CSS_SELECTOR, "h1").text
    # ReDoc's bundle always asks cdn.redoc.ly for its logo; the page's policy makes the
    # browser refuse it (a console error, and no request on the network).
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert all("cdn.redoc.ly" in e and "Content Security Policy" in e for e in errors), errors
    screenshot(browser, "api-docs-redoc")
    assert_only_local_requests(browser, url)
