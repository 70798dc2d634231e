# Sourced by the scripts that build a server's own virtualenv (comfyui-env.sh, llm-server-env.sh), with LOCK set
# to that server's lock file: the server installs exactly what its lock says, and with MAS_UNLOCKED=1
# (`bash scripts/lock.sh --servers`) resolves afresh and writes the lock from what it installed.

LOCKED=(-c "$LOCK")  # pip's option for every install of the build
if [[ "${MAS_UNLOCKED:-}" == 1 ]]; then LOCKED=(); fi

lock_key() {
    # the lock's hash: part of what a build is keyed by, so a new lock rebuilds the server
    echo "lock:$(sha256sum "$LOCK" | cut -c1-16)"
}

write_lock() {
    # after an unlocked build, the lock written from the virtualenv of the python in $1 (its header kept)
    [[ "${MAS_UNLOCKED:-}" == 1 ]] || return 0
    { sed -n '1,2p' "$LOCK"; "$1" -m pip freeze --all --disable-pip-version-check \
        | grep -v -i -E '^(setuptools|wheel)=='; } > "$LOCK.new"
    mv "$LOCK.new" "$LOCK"
}
