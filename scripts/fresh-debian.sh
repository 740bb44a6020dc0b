#!/usr/bin/env bash
# The README's two commands (scripts/test.sh, scripts/demo.sh) on a fresh
# Debian bookworm root: a guard against tests that lean on this machine's
# particulars (its certificate, its pg_hba.conf, its listeners, its host
# name). Needs root, debootstrap (installed with apt when missing) and
# Debian's package mirror; takes about half an hour on 2 cores. Not part of
# .ci/run.
#
#   sudo scripts/fresh-debian.sh            # a new root under /var/tmp, removed after
#   FRESH_KEEP=1 sudo scripts/fresh-debian.sh   # keep it, to look around
#
# Two phases:
# 1. With the host's network, in a chroot: the packages setup.sh would
#    install (services are not started: policy-rc.d denies it), the host's
#    Rust toolchain copied in (this machine may not reach the toolchain's
#    host), and the crates fetched.
# 2. In a network namespace of its own, with nothing but loopback, so its
#    PostgreSQL and RabbitMQ never meet the host's, and a host name of its
#    own (fresh-debian, as a new machine's differs from this one's, and
#    Debian's snakeoil certificate carries it): scripts/test.sh then
#    scripts/demo.sh, offline, as a new user would run them. setup.sh
#    starts the servers and makes the changes it makes on any machine.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { echo "==> fresh-debian: $*"; }
[ "$(id -u)" = 0 ] || { echo "fresh-debian: run as root (debootstrap, chroot, ip netns)" >&2; exit 1; }

root=$(mktemp -d /var/tmp/outbox-poll-fresh.XXXXXX)
chmod 755 "$root" # mktemp makes it 0700: the root of a system its users must enter
ns="outbox-poll-fresh-$$"
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }

cleanup() {
    set +e
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9
    ip netns delete "$ns" 2>/dev/null
    for mount in dev/pts dev proc sys; do umount -l "$root/$mount" 2>/dev/null; done
    if [ -z "${FRESH_KEEP:-}" ]; then rm -rf "$root"; else say "kept $root"; fi
}
trap cleanup EXIT

command -v debootstrap >/dev/null || { say "installing debootstrap"; apt-get install -y -qq debootstrap >/dev/null; }
say "debootstrap bookworm into $root"
debootstrap --variant=minbase --include=ca-certificates,git,procps,iproute2,openssl,runuser \
    bookworm "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
    debootstrap --variant=minbase --include=ca-certificates,git,procps,iproute2,openssl \
        bookworm "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1
say "root ready ($(elapsed))"

mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
cp /etc/resolv.conf "$root/etc/resolv.conf"
in_root() { chroot "$root" /usr/bin/env -i HOME=/root PATH=/root/.cargo/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 "$@"; }

# Phase 1: what needs the network. The package list is setup.sh's.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
say "installing setup.sh's packages (services not started)"
in_root apt-get update -qq
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    postgresql postgresql-client rabbitmq-server prometheus gcc libc6-dev libpq-dev pkg-config \
    curl >"$root.apt.log" 2>&1 || { tail -n 40 "$root.apt.log"; exit 1; }
rm "$root/usr/sbin/policy-rc.d"
# pg_createcluster gave the new cluster the first free port, and in this
# phase the host's PostgreSQL holds 5432 on the shared network: a fresh
# machine's cluster has 5432.
sed -i 's/^port = .*/port = 5432/' "$root"/etc/postgresql/*/main/postgresql.conf
# The certificates this machine trusts beyond Debian's (a proxy's, where
# the registries are reached through one), for phase 1's downloads.
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    in_root update-ca-certificates >/dev/null
fi
say "copying this machine's Rust toolchain ($(cargo --version))"
mkdir -p "$root/root/.cargo"
cp -a "$HOME/.rustup" "$root/root/.rustup"
cp -a "$HOME/.cargo/bin" "$root/root/.cargo/bin"
say "copying this checkout (committed files only) and fetching its crates"
git archive --format=tar --prefix=outbox-poll/ HEAD | tar -x -C "$root/root"
in_root sh -c 'cd /root/outbox-poll && cargo fetch --locked -q'
say "phase 1 done ($(elapsed))"

# Phase 2: loopback only.
ip netns add "$ns"
ip netns exec "$ns" ip link set lo up
echo fresh-debian >"$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 fresh-debian\n::1 localhost ip6-localhost\n' >"$root/etc/hosts"
# The snakeoil certificate was made at install time for the host's name:
# make it again for the fresh root's, as Debian's installer would have.
unshare --uts sh -c 'hostname fresh-debian && exec "$@"' - \
    chroot "$root" make-ssl-cert generate-default-snakeoil --force-overwrite ||
    say "could not remake the snakeoil certificate (going on with the host's name in it)"
run_offline() {
    ip netns exec "$ns" unshare --uts sh -c 'hostname fresh-debian && exec "$@"' - \
        chroot "$root" /usr/bin/env -i HOME=/root \
        PATH=/root/.cargo/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 CARGO_NET_OFFLINE=true \
        sh -c "cd /root/outbox-poll && $1"
}
status=0
for command in scripts/test.sh scripts/demo.sh; do
    say "$command in the fresh root ($(elapsed))"
    if run_offline "$command" >"$root.$(basename "$command").log" 2>&1; then
        say "$command passed ($(elapsed))"
    else
        status=$?
        say "$command FAILED with $status ($(elapsed)); the last lines:"
        tail -n 30 "$root.$(basename "$command").log"
    fi
    grep -E '^test result:' "$root.$(basename "$command").log" || true
done
say "logs: $root.*.log"
exit "$status"
