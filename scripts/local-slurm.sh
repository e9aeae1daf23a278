#!/usr/bin/env bash
# A one-node Slurm cluster on localhost, for testing sweeps through hydra/launcher=submitit_slurm.
#   scripts/local-slurm.sh install        apt-get install slurm-wlm munge (needs root)
#   scripts/local-slurm.sh start DIR      start munged, slurmctld and slurmd with state in DIR; wait until
#                                         sinfo shows the node idle; print the SLURM_CONF to export
#   scripts/local-slurm.sh stop DIR       stop them and remove DIR's state
# Partition "debug", this host's cores and 20 GB; no accounting (submitit then warns that sacct fails).
set -euo pipefail
cmd=${1:?install|start|stop}
dir=${2:-/tmp/tripy-build-slurm}

case "$cmd" in
install)
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge
  ;;
start)
  mkdir -p "$dir"/{state,spool,log,run}
  host=$(hostname)
  if [ ! -f /etc/munge/munge.key ]; then
    mkdir -p /etc/munge && head -c 1024 /dev/urandom > /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  pgrep -x munged > /dev/null || munged --force
  cat > "$dir/slurm.conf" <<CONF
ClusterName=tripybuild
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
NodeName=$host CPUs=$(nproc) RealMemory=20000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF="$dir/slurm.conf"
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  for _ in $(seq 60); do
    if sinfo -h -o '%t' 2>/dev/null | grep -qx idle; then
      echo "SLURM_CONF=$SLURM_CONF"
      exit 0
    fi
    sleep 1
  done
  echo "slurm did not come up; logs in $dir/log" >&2
  exit 1
  ;;
stop)
  for pidfile in "$dir/run/slurmd.pid" "$dir/run/slurmctld.pid"; do
    [ -f "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  sleep 1
  rm -rf "$dir"
  ;;
*)
  echo "usage: $0 install|start DIR|stop DIR" >&2
  exit 2
  ;;
esac
