# Sourced by the deploy scripts: free loopback ports for containers to publish.
#
# Drawn below the kernel's ephemeral range (32768-60999): a port `bind(0)`
# hands out is also what the kernel uses for the local side of outgoing
# connections, and with the librdkafka suite connecting beside the deploy
# step such a port was taken between the check and Docker's bind ("port is
# already allocated"). The Rust harness draws from the same range for the
# same reason (tests/src/node.rs, free_port).

taken_ports=""

# take_free_port NAME: sets and exports NAME to a port no listener holds,
# distinct from the ones this script took before.
take_free_port() {
    local name=$1 port
    for _ in $(seq 1000); do
        port=$((20000 + RANDOM % 12000))
        case " $taken_ports " in *" $port "*) continue ;; esac
        if python3 -c 'import socket, sys; socket.socket().bind(("127.0.0.1", int(sys.argv[1])))' "$port" 2>/dev/null; then
            taken_ports="$taken_ports $port"
            printf -v "$name" '%s' "$port"
            export "${name?}"
            return 0
        fi
    done
    echo "no free port in 20000-31999" >&2
    return 1
}
