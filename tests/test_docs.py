"""The configuration reference is generated from the schema and must stay in step with it."""

from pathlib import Path

from tools.config_docs import render

ROOT = Path(__file__).resolve().parent.parent


def test_configuration_reference_matches_schema():
    on_disk = (ROOT / "docs" / "configuration.md").read_text()
    assert on_disk == render(), "run: .venv/bin/python -m tools.generate"


def test_every_schema_key_is_documented():
    text = (ROOT / "docs" / "configuration.md").read_text()
    for key in (
        "data_dir",
        "public_dir",
        "gpus[].type",
        "profiles.a800.price_per_hour",
        "local.sandbox",
        "local.uid_base",
        "hub.api_port",
    ):
        assert f"`{key}`" in text


def test_readme_shows_the_spawn_page():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/images/spawn-page.png)" in readme
    image = ROOT / "docs" / "images" / "spawn-page.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_readme_shows_a_page_in_chinese_and_links_the_languages_doc():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/images/spawn-page-zh.png)" in readme and "简体中文" in readme
    assert "](docs/languages.md)" in readme
    image = ROOT / "docs" / "images" / "spawn-page-zh.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    languages = (ROOT / "docs" / "languages.md").read_text()
    assert "](images/spawn-page-zh.png)" in languages
    # the parts it says stay in English are JupyterHub's and NativeAuthenticator's own
    # templates, not meterhub's
    templates = {p.name for p in (ROOT / "hub" / "templates").glob("*.html")}
    for kept in ("home.html", "spawn_pending.html", "token.html", "error.html"):
        assert f"`{kept}`" in languages and kept not in templates, kept
    for ours in ("login.html", "spawn.html", "signup.html", "authorization-area.html"):
        assert ours in templates, ours
