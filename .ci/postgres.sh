# shellcheck shell=bash
# PostgreSQL on loopback for tests/test_postgres.py (a Postgres-backed Dagster instance).
#
# Sourced by .ci/run (as root on a fresh Debian machine, CI=true); also usable by hand: `source .ci/postgres.sh`.
# - installs the `postgresql` package when no server binaries are found (apt-get, non-interactive; root only);
# - runs its own cluster (not the distribution's) in $ROUTER_LITE_PG_DATA (default /var/tmp/router-lite-pg),
#   listening on 127.0.0.1:$ROUTER_LITE_PG_PORT (default 54329) only, as the `postgres` user when run as root;
# - creates role + database `router_lite` (password `router_lite`) when missing;
# - exports ROUTER_LITE_PG_URL (postgresql+psycopg2://...) and DAGSTER_PG_HOST/PORT/USER/PASSWORD/DB/SCHEME (the
#   names dagster.yaml's commented Postgres block reads).
# Idempotent: a second run finds the server answering and only re-exports the variables (well under a second).
# Returns non-zero (never exits the calling shell) when PostgreSQL cannot be started.

_rl_pg_log() { echo "postgres.sh: $*" >&2; }

_rl_pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return 0; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return 0; fi
  return 1
}

_rl_pg_main() {
  local port="${ROUTER_LITE_PG_PORT:-54329}"
  local data="${ROUTER_LITE_PG_DATA:-/var/tmp/router-lite-pg}"
  local user=router_lite password=router_lite db=router_lite
  local bin as_pg=() out

  if ! bin=$(_rl_pg_bindir); then
    if [ "$(id -u)" != 0 ]; then
      _rl_pg_log "PostgreSQL is not installed and this is not root: apt-get install postgresql first"
      return 1
    fi
    _rl_pg_log "installing postgresql (apt-get)"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null; }; then
      _rl_pg_log "apt-get install postgresql failed"
      return 1
    fi
    if ! bin=$(_rl_pg_bindir); then
      _rl_pg_log "postgresql installed but initdb not found under /usr/lib/postgresql/*/bin"
      return 1
    fi
  fi

  # the server refuses to run as root: use the package's `postgres` user
  if [ "$(id -u)" = 0 ]; then
    if ! id postgres >/dev/null 2>&1; then
      useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres || return 1
    fi
    as_pg=(runuser -u postgres -- env -C /)  # from /: the caller's directory may be closed to postgres
  fi

  if ! "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" >/dev/null 2>&1; then
    mkdir -p "$data" || return 1
    if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$data" || return 1; fi
    chmod 700 "$data" || return 1
    if [ ! -s "$data/PG_VERSION" ]; then
      _rl_pg_log "initdb $data"
      if ! "${as_pg[@]}" "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
            -E UTF8 --locale=C.UTF-8 >"$data.initdb.log" 2>&1; then
        if ! "${as_pg[@]}" "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
              -E UTF8 --no-locale >"$data.initdb.log" 2>&1; then
          _rl_pg_log "initdb failed: $(tail -n 5 "$data.initdb.log")"
          return 1
        fi
      fi
    fi
    _rl_pg_log "starting PostgreSQL on 127.0.0.1:$port"
    if ! "${as_pg[@]}" "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
          -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$data" start >/dev/null; then
      _rl_pg_log "pg_ctl start failed: $(tail -n 5 "$data/server.log" 2>/dev/null)"
      return 1
    fi
  fi

  # superuser over the cluster's own unix socket (trust); role and database once
  local psql=("${as_pg[@]}" "$bin/psql" -h "$data" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA)
  if ! out=$("${psql[@]}" -c "SELECT 1 FROM pg_roles WHERE rolname = '$user'" 2>&1); then
    _rl_pg_log "cannot reach the server as postgres: $out"
    return 1
  fi
  if [ "$out" != 1 ]; then
    "${psql[@]}" -c "CREATE ROLE $user LOGIN CREATEDB PASSWORD '$password'" >/dev/null || return 1
  fi
  out=$("${psql[@]}" -c "SELECT 1 FROM pg_database WHERE datname = '$db'") || return 1
  if [ "$out" != 1 ]; then
    "${psql[@]}" -c "CREATE DATABASE $db OWNER $user" >/dev/null || return 1
  fi

  export DAGSTER_PG_HOST=127.0.0.1 DAGSTER_PG_PORT="$port" DAGSTER_PG_USER="$user" \
         DAGSTER_PG_PASSWORD="$password" DAGSTER_PG_DB="$db"
  # +psycopg2: SQLAlchemy >= 2.1 maps a bare postgresql:// to psycopg 3, which dagster-postgres does not install
  export DAGSTER_PG_SCHEME=postgresql+psycopg2
  export ROUTER_LITE_PG_URL="postgresql+psycopg2://$user:$password@127.0.0.1:$port/$db"
  _rl_pg_log "ready: ROUTER_LITE_PG_URL=postgresql+psycopg2://$user:***@127.0.0.1:$port/$db"
  return 0
}

_rl_pg_main
_rl_pg_rc=$?
unset -f _rl_pg_main _rl_pg_bindir _rl_pg_log
# `return` when sourced (the caller keeps running); `exit` when run as a script
return "$_rl_pg_rc" 2>/dev/null || exit "$_rl_pg_rc"
