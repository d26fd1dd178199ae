#!/bin/sh
# Stand-in for ssh that lets one machine play several nodes in tests (Open MPI's
# `--mca plm_rsh_agent scripts/fake_node_rsh.sh`): PRRTE calls `AGENT [opts] HOST COMMAND...`;
# this drops the options and the host name and runs the command here, in its own process group,
# with FTCOMM_FAKE_NODE=HOST so that tests can tell the fake nodes' daemons apart.
while [ $# -gt 0 ]; do
    case "$1" in
        -*) shift ;;
        *) break ;;
    esac
done
FTCOMM_FAKE_NODE="$1"
export FTCOMM_FAKE_NODE
shift
exec /bin/sh -c "$*"
