# One node's part of a bandwidth round with iperf3 (`invoke bandwidth`, where every node has
# it): `sh -c TEXT - PORT PEER SECONDS LIMIT`. A one-off iperf3 server on PORT takes the node
# that sends to this one; at the same time an iperf3 client sends to PEER for SECONDS (whole
# seconds: iperf3's -t), retried while the peer's server is not up yet. Prints the client's
# JSON (iperf3 -J, or iperf3's error line when it fails before its JSON) and `@@client RC`,
# then `@@server RC` and what the server wrote on stderr (its own error line, if any), then
# `@@end`; the controller tells from both whose iperf3 failed a pair (ops/health/pairs.py).
# PEER "-" only serves. Everything stops after LIMIT seconds.
port=$1 peer=$2 secs=$3 lim=$4
if ! command -v iperf3 >/dev/null 2>&1; then
    printf '%s\n@@client 127\n@@server 127\n%s\n@@end\n' '{"error": "not found on the PATH"}' \
        'iperf3: not found on the PATH'
    exit 0
fi
client() {
    [ "$peer" != - ] || return 0
    i=0
    while :; do
        out=$(timeout "$lim" iperf3 -c "$peer" -p "$port" -t "$secs" -J 2>&1)
        rc=$?
        case "$out" in
            *"unable to connect"*|*"Connection refused"*) [ "$i" -lt 60 ] || break; i=$((i + 1)); sleep 0.25 ;;
            *) break ;;
        esac
    done
    printf '%s\n@@client %s\n' "$out" "$rc"
}
# The client writes to the real stdout (fd 3) while the server's words are kept; they are
# printed after the client's, so the two never interleave.
exec 3>&1
srv=$(
    client >&3 &
    err=$(timeout "$lim" iperf3 -s -1 -p "$port" 2>&1 >/dev/null)
    rc=$?
    wait
    printf '@@server %s\n%s' "$rc" "$err"
)
printf '%s\n@@end\n' "$srv"
