#!/bin/sh
# ftcomm-run's launch agent for Open MPI's daemons under `ftcomm-run --restarts` (set as
# `--mca plm_rsh_agent`): it runs the agent that would have been used (ssh by default,
# fake_node_rsh.sh under --fake-nodes, or the user's plm_rsh_agent) and records each daemon
# session in RECORD_DIR, so that ftcomm-run can tell which hosts lost their daemon and can kill
# whatever is left of a session. Called by PRRTE as
#
#   daemon_session.sh RECORD_DIR AGENT [AGENT OPTIONS] -- [OPTIONS] HOST COMMAND
#
# (ftcomm-run writes the part up to `--`; PRRTE appends the rest). The record
# RECORD_DIR/session-<pid of this script> holds `host HOST` and `pid PID` (the background
# subshell below; the session's processes share this script's process group) and, once the
# agent has ended, `status S`: its exit status; 128+N when a signal ended it; 255 when ssh lost
# its connection or a fake node's daemon died.
set -u
record_dir=$1
shift

# Drop the `--` from the arguments, keeping their order, and find the host: the first word after
# `--` that is neither an option nor an option's value (ssh's options that take one).
host= seen_separator= option_value=
for arg do
    shift
    if [ -z "$seen_separator" ] && [ "$arg" = "--" ]; then
        seen_separator=1
        continue
    fi
    if [ -n "$seen_separator" ] && [ -z "$host" ]; then
        if [ -n "$option_value" ]; then
            option_value=
        else
            case $arg in
                -[BbcDEeFIiJLlmOoPpQRSWw]) option_value=1 ;;
                -*) ;;
                *) host=${arg#*@} ;;
            esac
        fi
    fi
    set -- "$@" "$arg"
done

record="$record_dir/session-$$"
printf 'host %s\n' "$host" > "$record" 2>/dev/null || record=/dev/null

# The agent runs in a background subshell that records how it ended: at an abnormal end of the
# job PRRTE SIGKILLs this script (the process it started), and the subshell must outlive it to
# write the status. Its standard input is this script's (a background job's would be /dev/null).
(
    "$@"
    status=$?
    printf 'status %s\n' "$status" >> "$record"
    exit $status
) <&0 &
printf 'pid %s\n' "$!" >> "$record"
wait $!
