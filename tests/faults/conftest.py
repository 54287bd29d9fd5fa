from __future__ import annotations

from pathlib import Path

import bcrypt
import pytest

from tests.faults.certs import Certs, make_certs

PASSWORD = "s3cret-pa55"


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="session")
def password_hash() -> str:
    return bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
