# Sourced by the GPU scripts (gpu_check.sh, gpu_experiments.sh) from the repository root: the repository on the
# Python path, and what bench/gpu_carry.sh prepared, since the GPU image has no network: nibabel's wheel, the
# brain-data files.
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
[[ -d .gpu_site ]] && export PYTHONPATH=$PWD/.gpu_site:$PYTHONPATH
