#!/usr/bin/env bash
# A private, throw-away Slurm 22.05 cluster on this host, for tests.
#
#   cluster.sh install     install the Debian packages (as root; idempotent, quiet)
#   cluster.sh start DIR   start munged, mariadbd, slurmdbd, slurmctld and two slurmd
#                          (nodes n1 and n2) whose whole state lives under DIR; writes
#                          DIR/env.sh (what a client must export) and returns once
#                          sinfo shows both nodes idle and sacctmgr answers
#   cluster.sh stop DIR    stop exactly what `start DIR` started (daemons, job steps
#                          and the jobs' processes), nothing else
#
# Network safety: all traffic stays on 127.0.0.1 and nothing may ask the machine's
# DNS resolver.  The daemons (and therefore every job, which inherits their mount
# namespace) run under `unshare --mount` with private /etc/hosts, /etc/nsswitch.conf
# ("hosts: files") and /etc/resolv.conf (127.0.0.1) bind-mounted over the real ones,
# which are never touched.  Clients outside the namespace (sbatch, squeue, sacct,
# scancel run by the test process) need only SLURM_CONF: slurm.conf names every
# daemon by IP address, so they never resolve a node name.  Never run a Slurm client
# without SLURM_CONF: it would then look for DNS SRV records.
#
# Layout of DIR: etc/ (slurm.conf, slurmdbd.conf, hosts...), munge/ (key, socket),
# db/ (MariaDB data), state/, run/ (pid files, mntns), log/, env.sh.
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server-core mariadb-client-core)
START_TIMEOUT=${SLURM_TEST_START_TIMEOUT:-60}   # seconds, whole start
CLUSTER_NAME=testcluster
NODES=(n1 n2)
DB_USER=slurm
DB_PASS=slurmtestpass   # loopback-only throw-away database
CRED_EXPIRE=${SLURM_TEST_CRED_EXPIRE:-10}  # seconds; also the requeue delay (default 120)
SELF=$(readlink -f "${BASH_SOURCE[0]}")

die() { echo "cluster.sh: error: $*" >&2; exit 1; }
now() { date +%s.%N; }
# elapsed_since T0 -> integer seconds since T0
elapsed_since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%d", b - a }'; }

# ----------------------------------------------------------------------------- install
cmd_install() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $(id -u) -eq 0 ]] || die "must be root to install: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    local log; log=$(mktemp)
    # (no init system / policy-rc.d here: the postinst scripts start no system daemon)
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"; } \
            >"$log" 2>&1; then
        tail -n 30 "$log" >&2; rm -f "$log"; die "apt-get install failed"
    fi
    rm -f "$log"
}

# ----------------------------------------------------------------------------- helpers
# free_ports N -> N distinct free TCP ports on 127.0.0.1 (asked from the kernel).
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# port_open PORT -> true when something listens on 127.0.0.1:PORT
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pid_alive PID -> true if PID exists and is not a zombie (a zombie passes kill -0)
pid_alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }          # the field after "(comm) " is the state
    [[ ${stat%% *} != Z ]]
}

# mntns_of PID -> the mount namespace id ("mnt:[4026...]") of PID, or nothing
mntns_of() { readlink "/proc/$1/ns/mnt" 2>/dev/null || true; }

# ns_pids NS -> pids of live processes in mount namespace NS (never our own namespace)
ns_pids() {
    local ns=$1 p
    [[ -n $ns && $ns != "$(mntns_of $$)" && $ns != "$(mntns_of 1)" ]] || return 0
    local pat=${ns//[/\\[}; pat=${pat//]/\\]}   # -lname takes a glob: quote [ ]
    for p in $(find /proc/[0-9]*/ns/mnt -maxdepth 0 -lname "$pat" 2>/dev/null | cut -d/ -f3); do
        pid_alive "$p" && echo "$p"
    done
    return 0
}

logs_tail() {
    local f
    for f in "$D"/log/{munged,mariadb,slurmdbd,slurmctld,slurmd-n1,slurmd-n2}.log; do
        [[ -f $f ]] || continue
        echo "----- $f (last 15 lines)" >&2
        tail -n 15 "$f" >&2
    done
}

set_dir() {
    [[ -n ${1:-} ]] || die "usage: cluster.sh start|stop DIR"
    D=$(readlink -m "$1")
    # Unix socket paths are limited to 107 bytes.
    (( ${#D} <= 60 )) || die "DIR path too long for the unix sockets under it (${#D} > 60 chars): $D"
}

# ----------------------------------------------------------------------------- start
write_configs() {
    local host short cpus mem
    host=$(uname -n); short=${host%%.*}
    cpus=$(nproc); (( cpus >= 2 )) || cpus=2     # config_overrides: may exceed real cores
    mem=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 / 2 }' /proc/meminfo)
    read -r CTLD_PORT DBD_PORT DB_PORT N1_PORT N2_PORT <<<"$(free_ports 5)"

    # Private name resolution for the namespace: the nodes, the host's own name (the
    # controller's name and what gethostname() returns in jobs), and ::ffff: twins,
    # which answer reverse lookups of v4-mapped peers (gloo does them).
    cat >"$D/etc/hosts" <<EOF
127.0.0.1 localhost $host $short ${NODES[*]}
::1 localhost ip6-localhost ip6-loopback
::ffff:127.0.0.1 localhost $host $short ${NODES[*]}
EOF
    sed 's/^hosts:.*/hosts: files/' /etc/nsswitch.conf >"$D/etc/nsswitch.conf"
    grep -q '^hosts:' "$D/etc/nsswitch.conf" || echo 'hosts: files' >>"$D/etc/nsswitch.conf"
    # Anything that still tries DNS inside the namespace hits a closed loopback port.
    echo 'nameserver 127.0.0.1' >"$D/etc/resolv.conf"

    local sock=$D/munge/munge.socket
    cat >"$D/etc/slurm.conf" <<EOF
# generated by cluster.sh: private test cluster, loopback only
ClusterName=$CLUSTER_NAME
SlurmctldHost=$short(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
AuthType=auth/munge
# cred_expire also delays a requeued job's restart (default 120 s)
AuthInfo=socket=$sock,cred_expire=$CRED_EXPIRE
CredType=cred/munge
CommunicationParameters=NoInAddrAny,NoCtldInAddrAny
StateSaveLocation=$D/state/ctld
SlurmdSpoolDir=$D/state/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# default batch_sched_delay starts array tasks in 3 s waves; the default intervals
# (60 s main loop, 30 s backfill) delay a requeued job's restart
SchedulerParameters=batch_sched_delay=0,sched_interval=1,bf_interval=1
KillWait=2
OverTimeLimit=0
InactiveLimit=0
MinJobAge=300
ReturnToService=2
MailProg=/bin/true
MpiDefault=none
# both slurmd run on the same cores: trust the figures below, never drain for them
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# the munge socket; without it clients talking to slurmdbd use the system socket and hang
AccountingStoragePass=$sock
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=n1 Port=$N1_PORT CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 NodeHostname=n2 Port=$N2_PORT CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
PartitionName=cpu2 Nodes=n1,n2 MaxTime=INFINITE State=UP
EOF

    cat >"$D/etc/slurmdbd.conf" <<EOF
# generated by cluster.sh
AuthType=auth/munge
AuthInfo=socket=$sock
DbdHost=$short
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=$(id -un)
PidFile=$D/run/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$D/etc/slurmdbd.conf"   # slurmdbd refuses a readable one

    echo "$DB_PORT" >"$D/run/db_port"
    printf 'export SLURM_CONF=%q\n' "$D/etc/slurm.conf" >"$D/env.sh"
}

# Runs inside the private mount namespace (see cmd_start); starts the daemons, which
# fork away and keep the namespace alive.  stdio is already redirected to a log.
inner_start() {
    mount --bind "$D/etc/hosts" /etc/hosts
    mount --bind "$D/etc/nsswitch.conf" /etc/nsswitch.conf
    # (without any resolv.conf glibc already asks 127.0.0.1)
    [[ ! -e /etc/resolv.conf ]] || mount --bind "$D/etc/resolv.conf" /etc/resolv.conf
    mntns_of $$ >"$D/run/mntns"
    export SLURM_CONF=$D/etc/slurm.conf

    # --force: munged refuses a socket below a folder that not all users may enter
    # (pytest's /tmp/pytest-of-root is 0700); every client here is root.
    munged --socket="$D/munge/munge.socket" --key-file="$D/munge/munge.key" \
        --pid-file="$D/run/munged.pid" --log-file="$D/log/munged.log" \
        --seed-file="$D/munge/munged.seed" --origin=127.0.0.1 --force

    local db_port; db_port=$(cat "$D/run/db_port")
    # mariadbd does not daemonize: detach it (setsid, no inherited stdio).
    setsid mariadbd --no-defaults --user=root --datadir="$D/db" --tmpdir="$D/tmp" \
        --socket="$D/run/mariadb.sock" --port="$db_port" --bind-address=127.0.0.1 \
        --skip-name-resolve --pid-file="$D/run/mariadbd.pid" --log-error="$D/log/mariadb.log" \
        --innodb-buffer-pool-size=32M --innodb-log-file-size=16M \
        --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 --innodb-use-native-aio=0 \
        --skip-log-bin </dev/null >/dev/null 2>&1 &
    # (mariadb-admin is not in mariadb-client-core: probe with the plain client)
    local i sql=(timeout 5 mariadb --no-defaults --socket="$D/run/mariadb.sock" -uroot)
    for ((i = 0; i < 300; i++)); do
        [[ -S $D/run/mariadb.sock ]] && "${sql[@]}" -e 'SELECT 1' >/dev/null 2>&1 && break
        sleep 0.1
    done
    "${sql[@]}" -e "
        CREATE USER IF NOT EXISTS '$DB_USER'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO '$DB_USER'@'127.0.0.1';"

    slurmdbd
    local dbd_port; dbd_port=$(awk -F= '$1 == "DbdPort" { print $2 }' "$D/etc/slurmdbd.conf")
    for ((i = 0; i < 200; i++)); do port_open "$dbd_port" && break; sleep 0.1; done

    slurmctld
    local n
    for n in "${NODES[@]}"; do slurmd -N "$n"; done
}

# cancel_all_jobs -> scancel every job slurmctld knows (quietly; false if it did not answer)
cancel_all_jobs() {
    local out jobs
    out=$(timeout 5 squeue -h -o %A 2>/dev/null) || return 1
    mapfile -t jobs <<<"$out"
    [[ -z ${jobs[0]} ]] || timeout 5 scancel "${jobs[@]}" >/dev/null 2>&1 || true
}

# ready -> true when both nodes are idle and the accounting database answers
ready() {
    local out
    out=$(timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
    [[ $(awk '$2 == "idle" { print $1 }' <<<"$out" | sort -u | tr '\n' ' ') == "${NODES[*]} " ]] \
        || return 1
    timeout 5 sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER_NAME"
}

cmd_start() {
    [[ $(id -u) -eq 0 ]] || die "must run as root"
    local p t0; t0=$(now)
    for p in slurmctld slurmd slurmdbd munged mariadbd; do
        [[ -x /usr/sbin/$p ]] || die "/usr/sbin/$p missing: run \`bash $SELF install\` as root"
    done
    if [[ -s $D/run/mntns && -n $(ns_pids "$(cat "$D/run/mntns")") ]]; then
        die "a cluster is already running in $D (cluster.sh stop $D first)"
    fi
    mkdir -p "$D"/{etc,munge,db,tmp,state/ctld,run,log}
    chmod 0755 "$D/munge"   # munged: the socket folder must be reachable by all
    write_configs
    export SLURM_CONF=$D/etc/slurm.conf

    if [[ ! -s $D/munge/munge.key ]]; then
        head -c 1024 /dev/urandom >"$D/munge/munge.key"
        chmod 0400 "$D/munge/munge.key"
    fi
    if [[ ! -d $D/db/mysql ]]; then
        # Its temporary tables in a folder of its own, not /tmp, where other programs come and go.
        mariadb-install-db --no-defaults --user=root --datadir="$D/db" --tmpdir="$D/tmp" --skip-test-db \
            --auth-root-authentication-method=socket >"$D/log/mariadb-install.log" 2>&1 \
            || { tail -n 20 "$D/log/mariadb-install.log" >&2; die "mariadb-install-db failed"; }
    fi

    # The namespace lives on in the daemons once this child exits.
    if ! timeout "$START_TIMEOUT" unshare --mount --propagation private -- \
            bash "$SELF" _inner_start "$D" </dev/null >>"$D/log/start.log" 2>&1; then
        echo "cluster.sh: starting the daemons failed (see $D/log/start.log)" >&2
        tail -n 20 "$D/log/start.log" >&2
        logs_tail; cmd_stop >/dev/null 2>&1 || true
        exit 1
    fi

    while ! ready; do
        # A cluster killed without `stop` leaves jobs in slurmctld's saved state; they
        # are dead but keep their nodes busy: cancel whatever a fresh start recovered.
        cancel_all_jobs
        if (( $(elapsed_since "$t0") >= START_TIMEOUT )); then
            echo "cluster.sh: error: cluster in $D not ready after ${START_TIMEOUT}s" >&2
            timeout 5 sinfo -N >&2 || true
            logs_tail; cmd_stop >/dev/null 2>&1 || true
            exit 1
        fi
        sleep 0.2
    done
    echo "cluster.sh: cluster ready in $D after $(awk -v a="$t0" -v b="$(now)" \
        'BEGIN { printf "%.1f", b - a }') s; source $D/env.sh"
}

# ----------------------------------------------------------------------------- stop
# term_wait SECONDS PID... -> SIGTERM the pids, wait until gone, then SIGKILL the rest
term_wait() {
    local secs=$1 p i left; shift
    (( $# )) || return 0
    kill -TERM "$@" 2>/dev/null || true
    for ((i = 0; i < secs * 10; i++)); do
        left=()
        for p in "$@"; do pid_alive "$p" && left+=("$p"); done
        (( ${#left[@]} )) || return 0
        sleep 0.1
    done
    kill -KILL "${left[@]}" 2>/dev/null || true
    sleep 0.2
}

# our_pid NAME -> the pid in DIR/run/NAME.pid, if it is alive and in our namespace
our_pid() {
    local f=$D/run/$1.pid p
    [[ -s $f ]] || return 0
    p=$(tr -dc '0-9' <"$f")
    [[ -n $p ]] && pid_alive "$p" && [[ $(mntns_of "$p") == "$NS" ]] && echo "$p"
    return 0
}

cmd_stop() {
    NS=$(cat "$D/run/mntns" 2>/dev/null || true)
    [[ -n $NS ]] || { echo "cluster.sh: nothing recorded as running in $D"; return 0; }
    local t0; t0=$(now)
    local p i keep pids=()
    # 0. cancel the jobs still queued or running, so that accounting records their end
    #    and slurmctld saves no running job (a later start of DIR would recover it)
    export SLURM_CONF=$D/etc/slurm.conf
    if [[ -n $(our_pid slurmctld) ]] && cancel_all_jobs; then
        for ((i = 0; i < 50; i++)); do
            [[ -z $(timeout 5 squeue -h -o %A 2>/dev/null) ]] && break
            sleep 0.2
        done
    fi
    # 1. controller and node daemons (slurmctld saves its state on SIGTERM)
    mapfile -t pids < <(for p in slurmctld slurmd-n1 slurmd-n2; do our_pid "$p"; done)
    term_wait 10 "${pids[@]}"
    # 2. anything else slurm started in the namespace: slurmstepd and the jobs
    keep=" $(our_pid slurmdbd) $(our_pid mariadbd) $(our_pid munged) "
    mapfile -t pids < <(for p in $(ns_pids "$NS"); do [[ $keep == *" $p "* ]] || echo "$p"; done)
    term_wait 2 "${pids[@]}"
    # 3. accounting, its database, and munge last (the others need it to the end)
    for p in slurmdbd:10 mariadbd:20 munged:5; do
        mapfile -t pids < <(our_pid "${p%:*}")
        term_wait "${p#*:}" "${pids[@]}"
    done
    # 4. whatever is left in the namespace (nothing, normally)
    mapfile -t pids < <(ns_pids "$NS")
    if (( ${#pids[@]} )); then
        kill -KILL "${pids[@]}" 2>/dev/null || true
        sleep 0.2
    fi
    mapfile -t pids < <(ns_pids "$NS")
    (( ${#pids[@]} == 0 )) || die "processes left in the cluster's namespace: ${pids[*]}"
    rm -f "$D/run/mntns"
    echo "cluster.sh: stopped in $(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }') s"
}

# ----------------------------------------------------------------------------- main
case ${1:-} in
    install) cmd_install ;;
    start) set_dir "${2:-}"; cmd_start ;;
    stop) set_dir "${2:-}"; cmd_stop ;;
    _inner_start) set_dir "${2:-}"; inner_start ;;
    *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
