"""Which job a GPU process belongs to, from the kernel: its cgroup, its initial environment, the kubelet.

``cgroup`` parses ``/proc/PID/cgroup`` (Slurm's and the kubelet's layouts; no I/O), ``environ``
reads the environment a process started with where the kernel lets us, ``podresources`` asks the
kubelet which pod holds each GPU. ``sources/processes.py`` joins them per process.
"""
