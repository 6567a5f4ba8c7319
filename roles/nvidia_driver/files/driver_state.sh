#!/bin/sh
# The NVIDIA driver's state, read-only, as one JSON line (tfcluster nvidia_driver role, state.yml):
#   secure_boot  mokutil --sb-state says enabled (no mokutil or no EFI: false)
#   installed    the nvidia module built for the running kernel (modinfo), "" if none
#   loaded       the version of the loaded module (the file given, /proc/driver/nvidia/version)
#   open         the loaded module is NVIDIA's open one
proc=${1:-/proc/driver/nvidia/version}
secure_boot=false
if mokutil --sb-state 2>/dev/null | grep -q 'SecureBoot enabled'; then
    secure_boot=true
fi
installed=$(modinfo -F version nvidia 2>/dev/null | sed -n '1{s/[^0-9.]//g;p;}')
loaded=""
open=false
if [ -r "$proc" ]; then
    line=$(head -n 1 "$proc")
    loaded=$(printf '%s\n' "$line" | sed -nE 's/^NVRM version: .*Kernel Module( for [^ ]+)? +([0-9]+\.[0-9.]+) .*/\2/p')
    case "$line" in *"Open Kernel Module"*) open=true ;; esac
fi
printf '{"secure_boot": %s, "installed": "%s", "loaded": "%s", "open": %s}\n' \
    "$secure_boot" "$installed" "$loaded" "$open"
