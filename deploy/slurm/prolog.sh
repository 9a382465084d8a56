#!/bin/sh
# gpulse's Slurm Prolog and Epilog, one script (epilog.sh is a link to it): the prolog notes which
# job holds which GPU of this node, the epilog removes what the prolog noted for its job, and only
# that. For a gpulse agent that cannot see the jobs' processes (in a container without the host's
# PID namespace); how to install it and how the agent reads it: deploy/slurm/README.md.
#
# slurmd runs it as root with SLURM_SCRIPT_CONTEXT (prolog_slurmd or epilog_slurmd), SLURM_JOB_ID,
# SLURM_JOB_UID, SLURM_JOB_USER, SLURM_JOB_ACCOUNT and SLURM_JOB_PARTITION set
# (src/plugins/prep/script/prep_script_slurmd.c, _build_env), and SLURM_JOB_GPUS, the job's GPUs on
# this node as Slurm's GPU indices, comma-separated (src/plugins/gres/common/gres_common.c,
# gres_common_prep_set_env). The prolog runs when the job starts on the node (with
# PrologFlags=Alloc: at allocation), the epilog when it ends.
#
# In $dir the prolog writes, each file aside and renamed into place under one lock, so a reader
# never sees half a file and two jobs starting at once keep each other's lines:
#   <gpu index>  one job id per line: NVIDIA dcgm-exporter's HPC job mapping (several lines when jobs
#                share the GPU through sharding or MPS)
#   job_<id>     the job's SLURM_JOB_USER, SLURM_JOB_UID, SLURM_JOB_ACCOUNT, SLURM_JOB_PARTITION, as
#                KEY=VALUE lines
# The epilog takes its job's line out of every GPU file (not only SLURM_JOB_GPUS's: it also cleans
# up after a prolog cut short), removes a file no job is left in, and the job's own file.
#
# It never fails a job for gpulse's sake: a failing Prolog sets the node DOWN and requeues the job,
# a failing Epilog sets the node DOWN (Slurm's Prolog and Epilog Guide, "Failure Handling"), and a
# missing label costs far less than a lost node. A failure is logged (to stderr, which slurmd logs,
# and to syslog, tag gpulse-slurm) and the script exits 0; a site that would rather have the node
# drained sets strict=1. slurmd starts the script with an environment of its own making, so both
# settings are changed here, in the installed copies.
dir=${GPULSE_SLURM_JOB_DIR:-/run/gpulse/slurm-jobs}
strict=${GPULSE_SLURM_STRICT:-0}

PATH=/usr/sbin:/usr/bin:/sbin:/bin # Slurm runs prologs and epilogs without a search path
umask 022
id=$SLURM_JOB_ID
part=${SLURM_SCRIPT_CONTEXT%_slurmd}
part=${part:-script}

fail() {
    echo "gpulse-slurm: $part of job $id: $*" >&2
    logger -t gpulse-slurm -- "$part of job $id: $*" 2>/dev/null
    [ "$strict" = 1 ] && exit 1
    exit 0
}

case $SLURM_SCRIPT_CONTEXT in
    prolog_slurmd | epilog_slurmd) ;;
    *) fail "SLURM_SCRIPT_CONTEXT '$SLURM_SCRIPT_CONTEXT': run as neither slurmd's Prolog nor its Epilog; nothing done" ;;
esac
case $id in '' | *[!0-9]*) fail "SLURM_JOB_ID '$id' is not a job id; nothing done" ;; esac
if [ "$part" = prolog ]; then
    gpus=$(echo "$SLURM_JOB_GPUS" | tr ',' ' ')
    for g in $gpus; do
        case $g in *[!0-9]*) fail "SLURM_JOB_GPUS '$SLURM_JOB_GPUS' is not a list of GPU indices; nothing done" ;; esac
    done
    [ -n "$gpus" ] || exit 0 # no GPU of this node is the job's
    mkdir -p "$dir" || fail "cannot create $dir; nothing done"
else
    [ -d "$dir" ] || exit 0 # no job ever had a GPU of this node mapped
fi
command -v flock >/dev/null || fail "flock(1) (util-linux) is not installed; nothing done"

# rewrite FILE: FILE without this job's line, into a temporary file ($tmp); 1 when no line is left
rewrite() {
    tmp=$dir/.${1##*/}.$$
    printf '' >"$tmp" || return 2
    [ -f "$1" ] || return 1
    grep -vx -- "$id" "$1" >>"$tmp"
}

prolog() {
    printf '%s\n' "SLURM_JOB_USER=$SLURM_JOB_USER" "SLURM_JOB_UID=$SLURM_JOB_UID" \
        "SLURM_JOB_ACCOUNT=$SLURM_JOB_ACCOUNT" "SLURM_JOB_PARTITION=$SLURM_JOB_PARTITION" >"$dir/.job_$id.$$" &&
        mv -f "$dir/.job_$id.$$" "$dir/job_$id" || return 1
    for g in $gpus; do # once per GPU, also when a requeued job's prolog runs again
        rewrite "$dir/$g"
        [ $? -le 1 ] && echo "$id" >>"$tmp" && mv -f "$tmp" "$dir/$g" || return 1
    done
}

epilog() {
    for f in "$dir"/[0-9]*; do
        case ${f##*/} in *[!0-9.]*) continue ;; esac
        [ -f "$f" ] && grep -qx -- "$id" "$f" || continue
        rewrite "$f"
        case $? in
            0) mv -f "$tmp" "$f" ;;
            1) rm -f "$tmp" "$f" ;; # no other job's line: the file goes
            *) return 1 ;;
        esac
    done
    rm -f "$dir/job_$id"
}

{ flock -w 10 9 && "$part"; } 9>>"$dir/.lock" || {
    rm -f "$dir"/.*."$$"
    fail "could not update the mapping in $dir"
}
exit 0
