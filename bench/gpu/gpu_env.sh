# Sourced by the GPU scripts (gpu_check.sh, gpu_experiments.sh) from the repository root: the repository on the
# Python path, and what bench/gpu/gpu_carry.sh prepared, since the GPU image has no network: nibabel's wheel, the
# brain-data files. Run on its own (bash bench/gpu/gpu_env.sh --help), it prints this header.
[[ ${BASH_SOURCE[0]} == "$0" ]] && { sed -n '/^#!/d; /^#/!q; s/^# \{0,1\}//p' "$0"; exit 0; }  # run, not sourced
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
[[ -d .gpu_site ]] && export PYTHONPATH=$PWD/.gpu_site:$PYTHONPATH
