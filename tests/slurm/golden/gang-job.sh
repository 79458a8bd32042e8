#!/bin/bash
# klique task g/1 (epoch 1), submitted by klique-worker.
# A stop is `scancel --signal=TERM --full` (the task gets SIGTERM; this script keeps waiting
# for it), then after the grace `scancel --batch --signal=USR2` (SIGKILL to the task's process
# group, this script included) and a hard `scancel`.
trap ':' TERM INT HUP
trap 'kill -KILL 0' USR2
# A gang over 2 nodes: rank 0's node is the master.
_klique_first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node "$_klique_first" -o | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
export MASTER_ADDR="${MASTER_ADDR:-$_klique_first}"
export MASTER_PORT="${MASTER_PORT:-29500}" WORLD_SIZE="$SLURM_JOB_NUM_NODES" LOCAL_WORLD_SIZE=1
if [ -x /py ] && [ -r /w.py ]; then
    /py -I /w.py /s/run/g_1.e1.exit -- srun --nodes 2 --ntasks-per-node 1 --kill-on-bad-exit=1 /bin/sh -c 'RANK=$SLURM_NODEID NODE_RANK=$SLURM_NODEID LOCAL_RANK=0 && export RANK NODE_RANK LOCAL_RANK && exec "$@"' klique-rank python train.py --lr 0.1 &
else
    srun --nodes 2 --ntasks-per-node 1 --kill-on-bad-exit=1 /bin/sh -c 'RANK=$SLURM_NODEID NODE_RANK=$SLURM_NODEID LOCAL_RANK=0 && export RANK NODE_RANK LOCAL_RANK && exec "$@"' klique-rank python train.py --lr 0.1 &
fi
_klique_pid=$!
while :; do
    wait "$_klique_pid"; _klique_rc=$?
    kill -0 "$_klique_pid" 2>/dev/null || break
done
exit "$_klique_rc"
