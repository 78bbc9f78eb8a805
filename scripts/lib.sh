#!/usr/bin/env bash
# Shared helpers for scripts/run and scripts/test. Source it, don't run it.
# Everything is prefixed notify_ so it cannot clash with the caller.
#
# notify_bring_up_deps makes MariaDB (3306), Redis (6379) and RabbitMQ (5672)
# available on 127.0.0.1, whether they are already running, installed but
# stopped, or not installed at all (Debian/Ubuntu, via apt-get).

# Repo root, resolved from this file (symlinks included) so callers may be
# started from any directory.
NOTIFY_ROOT="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
# .run/ is gitignored; noisy output (apt, daemons) goes there, not the terminal.
NOTIFY_DEPS_LOG="$NOTIFY_ROOT/.run/deps.log"

# The release build of what ./scripts/run runs and the image ships: the three
# binaries' packages only (not the benchmark or the test kit). scripts/test
# runs the very same command, so that both share one build (another package
# selection could unify features differently and rebuild).
# shellcheck disable=SC2034 # used by the scripts that source this file
NOTIFY_RELEASE_BUILD=(cargo build --release -p notify-api -p notify-worker -p notify-edge -p notifyctl)

notify_say() { printf '%s\n' "$*"; }

notify_die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# Show the end of the dependency log, then die: the log explains the failure.
notify_die_with_log() {
  if [ -s "$NOTIFY_DEPS_LOG" ]; then
    printf -- '--- last lines of %s ---\n' "$NOTIFY_DEPS_LOG" >&2
    tail -n 20 "$NOTIFY_DEPS_LOG" >&2
  fi
  notify_die "$*"
}

notify_banner() { printf '\n==> %s\n' "$*"; }

# Run a command as root: directly when we are root, via sudo otherwise.
notify_can_root() { [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1; }
notify_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    notify_die "need root to run '$*' but sudo is not installed"
  fi
}

# Print the path of the first program found. /usr/sbin is searched explicitly
# because it is not on a normal user's PATH on Debian, and the daemons live there.
notify_find_bin() {
  local name dir
  for name in "$@"; do
    if command -v "$name" >/dev/null 2>&1; then
      command -v "$name"
      return 0
    fi
    for dir in /usr/sbin /sbin /usr/local/sbin; do
      if [ -x "$dir/$name" ]; then
        printf '%s\n' "$dir/$name"
        return 0
      fi
    done
  done
  return 1
}

notify_have_systemd() { [ -d /run/systemd/system ]; }

# Pure-bash TCP probe (no nc needed); the timeout keeps a filtered port from hanging.
notify_port_open() {
  timeout 1 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null
}

# notify_wait_port NAME PORT SECONDS: poll every 0.5 s, die if it never opens.
notify_wait_port() {
  local name=$1 port=$2 secs=$3
  local tries=$((secs * 2))
  until notify_port_open "$port"; do
    tries=$((tries - 1))
    if [ "$tries" -le 0 ]; then
      notify_die_with_log "$name did not come up on 127.0.0.1:$port within ${secs}s (see $NOTIFY_DEPS_LOG and /var/log/$name*)"
    fi
    sleep 0.5
  done
}

# Toolchains can't be fetched from here, so only point the user at rustup.
notify_require_cargo() {
  if ! command -v cargo >/dev/null 2>&1 && [ -x "${HOME:-}/.cargo/bin/cargo" ]; then
    # rustup installs here; non-login shells often lack it on PATH.
    PATH="$HOME/.cargo/bin:$PATH"
    export PATH
  fi
  command -v cargo >/dev/null 2>&1 ||
    notify_die "cargo not found: install Rust with rustup (https://rustup.rs), open a new shell and re-run"
}

# notify_apt_install [--no-install-recommends] PKG...: one apt-get update,
# then a non-interactive install.
notify_apt_install() {
  local opts=()
  if [ "${1:-}" = --no-install-recommends ]; then
    opts+=("$1")
    shift
  fi
  command -v apt-get >/dev/null 2>&1 ||
    notify_die "missing packages ($*) and apt-get is unavailable: install them with your package manager"
  mkdir -p "$(dirname "$NOTIFY_DEPS_LOG")"
  notify_say "apt: installing $* (log: $NOTIFY_DEPS_LOG)"
  notify_as_root apt-get update >>"$NOTIFY_DEPS_LOG" 2>&1 ||
    notify_die_with_log "apt-get update failed"
  notify_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y "${opts[@]}" "$@" \
    >>"$NOTIFY_DEPS_LOG" 2>&1 || notify_die_with_log "apt-get install $* failed"
}

notify_start_mariadb() {
  if notify_have_systemd; then
    notify_as_root systemctl start mariadb >>"$NOTIFY_DEPS_LOG" 2>&1 ||
      notify_die_with_log "mariadb: systemctl start mariadb failed"
    return 0
  fi
  local mariadbd install_db
  mariadbd=$(notify_find_bin mariadbd mysqld) || notify_die "mariadb: mariadbd not found"
  # /run is a tmpfs: the socket/pid directory vanishes on reboot.
  notify_as_root mkdir -p /run/mysqld
  notify_as_root chown mysql:mysql /run/mysqld
  if ! notify_as_root test -d /var/log/mysql; then
    notify_as_root install -d -o mysql -g mysql /var/log/mysql
  fi
  # The package normally initialises the datadir; redo it if it is missing.
  if ! notify_as_root test -d /var/lib/mysql/mysql; then
    install_db=$(notify_find_bin mariadb-install-db mysql_install_db) ||
      notify_die "mariadb: datadir is empty and mariadb-install-db is missing"
    notify_as_root "$install_db" --user=mysql --datadir=/var/lib/mysql >>"$NOTIFY_DEPS_LOG" 2>&1 ||
      notify_die_with_log "mariadb: mariadb-install-db failed"
  fi
  # --user=mysql: mariadbd refuses to run as root without it.
  notify_as_root start-stop-daemon --start --oknodo --background --exec "$mariadbd" -- --user=mysql \
    >>"$NOTIFY_DEPS_LOG" 2>&1 || notify_die_with_log "mariadb: failed to start $mariadbd"
}

notify_start_redis() {
  if notify_have_systemd; then
    notify_as_root systemctl start redis-server >>"$NOTIFY_DEPS_LOG" 2>&1 ||
      notify_die_with_log "redis: systemctl start redis-server failed"
    return 0
  fi
  local redis
  redis=$(notify_find_bin redis-server) || notify_die "redis: redis-server not found"
  notify_as_root mkdir -p /var/lib/redis /var/log/redis
  # Throw-away dev/test cache: no persistence, loopback only.
  notify_as_root "$redis" --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log >>"$NOTIFY_DEPS_LOG" 2>&1 ||
    notify_die_with_log "redis: failed to start $redis"
}

notify_start_rabbitmq() {
  if notify_have_systemd; then
    notify_as_root systemctl start rabbitmq-server >>"$NOTIFY_DEPS_LOG" 2>&1 ||
      notify_die_with_log "rabbitmq: systemctl start rabbitmq-server failed"
    return 0
  fi
  local rabbit
  rabbit=$(notify_find_bin rabbitmq-server) || notify_die "rabbitmq: rabbitmq-server not found"
  # Not fatal: -detached also fails when a node is still booting; the port
  # wait afterwards decides whether RabbitMQ really came up.
  notify_as_root "$rabbit" -detached >>"$NOTIFY_DEPS_LOG" 2>&1 || true
}

# Port open is not quite "ready" for RabbitMQ (it is slow to boot).
notify_await_rabbitmq() {
  local ctl
  ctl=$(notify_find_bin rabbitmqctl) || return 0
  notify_as_root timeout 90 "$ctl" await_startup >>"$NOTIFY_DEPS_LOG" 2>&1 ||
    notify_die_with_log "rabbitmq: not ready after 90s (rabbitmqctl await_startup failed)"
}

# True when notify:notify@127.0.0.1 can create and drop a notify* database
# (what the service and the tests do), can see the server's transactions
# (the fault tests pick the connections they kill from them), and
# max_connections is at least 1000.
notify_mariadb_ready() {
  local probe="notify_probe_$$" out
  out=$("$1" -h127.0.0.1 -P3306 -unotify -pnotify -N \
    -e "CREATE DATABASE IF NOT EXISTS \`$probe\`; DROP DATABASE \`$probe\`;
        SELECT @@GLOBAL.max_connections >= 1000
          AND (SELECT COUNT(*) >= 0 FROM information_schema.INNODB_TRX);" \
    2>>"$NOTIFY_DEPS_LOG") && [ "$out" = 1 ]
}

# max_connections in a file of Debian's MariaDB configuration, so that it
# outlives a restart (SET GLOBAL raises it for the running server only).
# Nothing to do where the layout is not Debian's (docker-compose passes
# --max-connections itself).
notify_mariadb_config() {
  local dir=/etc/mysql/mariadb.conf.d
  local file="$dir/90-notify.cnf"
  [ -d "$dir" ] && notify_can_root || return 0
  notify_as_root test -f "$file" && return 0
  printf '%s\n' '# Written by Notify'"'"'s scripts: the api, the workers and the tests open' \
    '# many connection pools.' '[mysqld]' 'max_connections = 1000' |
    notify_as_root tee "$file" >/dev/null ||
    notify_die "mariadb: cannot write $file"
  notify_say "mariadb: max_connections = 1000 written to $file"
}

# Make sure notify:notify exists and owns every notify* database (the tests
# create and drop notify_t<random>_<n>), and allow enough connections for the
# many pools the tests open. Idempotent; needs MariaDB root only when
# something is missing, so a configured machine never prompts for sudo.
notify_setup_mariadb() {
  local client sql
  if ! client=$(notify_find_bin mariadb mysql); then
    # E.g. MariaDB runs in docker-compose, which sets the account up itself.
    notify_say "mariadb: no mariadb client installed, assuming the notify account exists"
    return 0
  fi
  notify_mariadb_config
  notify_mariadb_ready "$client" && return 0
  sql="$(cat "$NOTIFY_ROOT/scripts/mariadb-init.sql")
SET GLOBAL max_connections = GREATEST(@@GLOBAL.max_connections, 1000);"
  # Debian's root authenticates via unix_socket (needs OS root); otherwise
  # fall back to root without a password over TCP (CI images, docker-compose).
  if ! { notify_can_root && notify_as_root "$client" -uroot -e "$sql" >>"$NOTIFY_DEPS_LOG" 2>&1; } &&
    ! "$client" -h127.0.0.1 -P3306 -uroot -e "$sql" >>"$NOTIFY_DEPS_LOG" 2>&1; then
    notify_die_with_log "mariadb: cannot log in as root (socket or 127.0.0.1) to create the notify account"
  fi
  notify_mariadb_ready "$client" ||
    notify_die_with_log "mariadb: user notify/notify still cannot create notify* databases on 127.0.0.1:3306"
  notify_say "mariadb: notify account and grants set up"
}

notify_bring_up_deps() {
  notify_require_cargo
  mkdir -p "$(dirname "$NOTIFY_DEPS_LOG")"
  printf '\n=== bring-up %s ===\n' "$(date '+%F %T')" >>"$NOTIFY_DEPS_LOG"

  local names=(mariadb redis rabbitmq)
  local ports=(3306 6379 5672)
  local bins=("mariadbd mysqld" "redis-server" "rabbitmq-server")
  local packages=(mariadb-server redis-server rabbitmq-server)
  local state=() missing=() i

  # Only services that are down need their binaries: with docker-compose
  # everything already listens and nothing has to be installed.
  for i in "${!names[@]}"; do
    if notify_port_open "${ports[$i]}"; then
      state[i]=running
    else
      state[i]=down
      # shellcheck disable=SC2086 # bins[i] is a word list of alternatives.
      if ! notify_find_bin ${bins[$i]} >/dev/null; then
        state[i]=missing
        missing+=("${packages[$i]}")
      fi
    fi
  done
  # Build tools for cargo (protoc is vendored by the build, so not needed).
  local tool need_tools=0
  for tool in cc pkg-config curl; do
    command -v "$tool" >/dev/null 2>&1 || need_tools=1
  done
  if [ "${#missing[@]}" -gt 0 ] || [ "$need_tools" -eq 1 ]; then
    notify_apt_install "${missing[@]}" build-essential pkg-config curl ca-certificates
  fi

  # Start whatever is down (the package's postinst may already have done so).
  for i in "${!names[@]}"; do
    if [ "${state[$i]}" != running ] && ! notify_port_open "${ports[$i]}"; then
      "notify_start_${names[$i]}"
    fi
  done

  for i in "${!names[@]}"; do
    case ${state[$i]} in
    running) notify_say "${names[$i]}: running" ;;
    *)
      # RabbitMQ boots slowly; the other two are up within seconds.
      notify_wait_port "${names[$i]}" "${ports[$i]}" "$([ "${names[$i]}" = rabbitmq ] && echo 60 || echo 30)"
      if [ "${names[$i]}" = rabbitmq ]; then
        notify_await_rabbitmq
      fi
      if [ "${state[$i]}" = missing ]; then
        notify_say "${names[$i]}: installed and started"
      else
        notify_say "${names[$i]}: started"
      fi
      ;;
    esac
  done

  notify_setup_mariadb
}
