"""A Postgres-backed Dagster instance (dagster-postgres): materialisations land in PostgreSQL.

Needs ROUTER_LITE_PG_URL (postgresql://user:password@host:port/db), which `.ci/postgres.sh` starts and exports.
Without it the test is skipped, except under CI=true, where it must run (and fails if PostgreSQL is missing).
"""
import os
import uuid

import pytest
from dagster import AssetKey, DagsterInstance, materialize

from resources.storage import asset_path

PG_URL = os.environ.get("ROUTER_LITE_PG_URL", "")
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not PG_URL and not IN_CI,
                       reason="no PostgreSQL: set ROUTER_LITE_PG_URL (`source .ci/postgres.sh` starts one on "
                              "127.0.0.1 and exports it); under CI=true this test runs and fails instead"),
]


@pytest.fixture
def pg_database():
    """A fresh database for this test (dropped afterwards) when the role may create one, else the URL's own."""
    assert PG_URL, ("CI=true but ROUTER_LITE_PG_URL is not set: .ci/postgres.sh could not start PostgreSQL "
                    "(its messages are above the test output)")
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    url = make_url(PG_URL)
    if url.drivername == "postgresql":  # SQLAlchemy >= 2.1 would pick psycopg 3; dagster-postgres brings psycopg2
        url = url.set(drivername="postgresql+psycopg2")
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 10})
    name = f"router_lite_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        created = True
    except sa.exc.OperationalError as exc:
        admin.dispose()
        pytest.fail(f"PostgreSQL at {url.render_as_string(hide_password=True)} is not reachable: {exc.orig}")
    except sa.exc.ProgrammingError:  # no CREATEDB: use the URL's database as it is
        created = False
    yield (url.set(database=name) if created else url).render_as_string(hide_password=False)
    if created:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def test_materialisations_are_stored_in_postgres(pg_database, tmp_path, monkeypatch):
    import sqlalchemy as sa

    from assets.definitions import build_definitions

    # the instance config a team would use: postgres storage, the URL from the environment (no secret in the file)
    dagster_home = tmp_path / "dagster_home"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(
        "storage:\n  postgres:\n    postgres_url:\n      env: ROUTER_LITE_TEST_PG_URL\n"
        f"local_artifact_storage:\n  module: dagster._core.storage.root\n  class: LocalArtifactStorage\n"
        f"  config:\n    base_dir: {dagster_home}\n"
        "telemetry:\n  enabled: false\n")
    monkeypatch.setenv("ROUTER_LITE_TEST_PG_URL", pg_database)
    home = tmp_path / "home"
    defs = build_definitions(home=str(home), profile="smoke")
    everything = list(defs.assets) + list(defs.asset_checks or [])
    inst = DagsterInstance.from_config(str(dagster_home))
    try:
        assert type(inst.run_storage).__name__ == "PostgresRunStorage"
        assert type(inst.event_log_storage).__name__ == "PostgresEventLogStorage"
        r1 = materialize(everything, selection=[AssetKey("source_tasks")], partition_key="mmlu_pro", instance=inst,
                         resources=defs.resources)
        r2 = materialize(everything, selection=[AssetKey("task_pool")], instance=inst, resources=defs.resources)
        assert r1.success and r2.success
        latest = inst.get_latest_materialization_event(AssetKey("task_pool"))
        assert latest is not None and latest.run_id == r2.run_id
    finally:
        inst.dispose()
    assert (asset_path(home, "task_pool")).exists()

    # straight from PostgreSQL: the runs and their materialisation events
    engine = sa.create_engine(pg_database)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT run_id, asset_key, partition FROM event_logs "
                "WHERE dagster_event_type = 'ASSET_MATERIALIZATION' AND run_id IN (:a, :b)"),
                {"a": r1.run_id, "b": r2.run_id}).all()
            runs = {r[0] for r in conn.execute(sa.text("SELECT run_id FROM runs WHERE run_id IN (:a, :b)"),
                                                {"a": r1.run_id, "b": r2.run_id})}
            checks = conn.execute(sa.text(
                "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_CHECK_EVALUATION' "
                "AND run_id = :b"), {"b": r2.run_id}).scalar()
    finally:
        engine.dispose()
    assert runs == {r1.run_id, r2.run_id}
    assert sorted((run, key, part) for run, key, part in rows) == sorted(
        [(r1.run_id, '["source_tasks"]', "mmlu_pro"), (r2.run_id, '["task_pool"]', None)])
    assert checks >= 4  # task_pool's four asset checks ran in the same run


def test_the_documented_team_block_of_dagster_yaml_connects(pg_database, tmp_path, monkeypatch):
    """dagster.yaml's commented `postgres_db` block, uncommented as documented, with DAGSTER_PG_* variables."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    text = (Path(__file__).resolve().parents[1] / "dagster.yaml").read_text().splitlines()
    start = text.index("# storage:")
    block = []
    for line in text[start:]:
        if not line.startswith("#   ") and line != "# storage:":
            break
        block.append(line[2:])
    assert "postgres_db:" in "\n".join(block)
    url = make_url(pg_database)
    for var, value in {"DAGSTER_PG_HOST": url.host, "DAGSTER_PG_USER": url.username,
                       "DAGSTER_PG_PASSWORD": url.password or "", "DAGSTER_PG_DB": url.database,
                       "DAGSTER_PG_PORT": str(url.port or 5432)}.items():
        monkeypatch.setenv(var, value)
    (tmp_path / "dagster.yaml").write_text("\n".join(block) + "\ntelemetry:\n  enabled: false\n")
    inst = DagsterInstance.from_config(str(tmp_path))
    try:
        assert type(inst.run_storage).__name__ == "PostgresRunStorage"
        assert inst.get_runs(limit=1) is not None  # connected, tables created
    finally:
        inst.dispose()
