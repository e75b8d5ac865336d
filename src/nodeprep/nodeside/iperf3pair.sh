# One node's part of a bandwidth round with iperf3 (`invoke bandwidth`, where every node has
# it): `sh -c TEXT - PORT PEER SECONDS LIMIT`. A one-off iperf3 server on PORT takes the node
# that sends to this one; at the same time an iperf3 client sends to PEER for SECONDS (whole
# seconds: iperf3's -t), retried while the peer's server is not up yet. Prints the client's
# JSON (iperf3 -J), then `@@end`; PEER "-" only serves. Everything stops after LIMIT seconds.
port=$1 peer=$2 secs=$3 lim=$4
command -v iperf3 >/dev/null 2>&1 || { echo '{"error": "iperf3 not found on the PATH"}'; echo @@end; exit 0; }
timeout "$lim" iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
srv=$!
if [ "$peer" != - ]; then
    i=0
    while :; do
        out=$(timeout "$lim" iperf3 -c "$peer" -p "$port" -t "$secs" -J 2>&1)
        case "$out" in
            *"unable to connect"*|*"Connection refused"*) [ "$i" -lt 60 ] || break; i=$((i + 1)); sleep 0.25 ;;
            *) break ;;
        esac
    done
    printf '%s\n' "$out"
fi
echo @@end
wait "$srv"
