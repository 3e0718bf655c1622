#!/usr/bin/env bash
# Stage what an offline machine needs to run the study (scripts/offline_study.sh) when it already has Python with
# torch (a GPU box's image, say) but no route to a package index: the project's other Python dependencies as
# wheels in .whl/ and the shared libraries Procgen's libenv.so links (libGL and its X11 companions) as Debian
# packages in .gl/, procgen's for starpilot alone (scripts/slim_procgen_wheel.py). Both folders are kept out of git
# (.git/info/exclude). Run it here, with network:
#   bash scripts/offline_stage.sh [PYTHON_VERSION]      (default 3.12, the version the offline machine runs)
# With `robot` after the version it stages the robot task instead (`ENV=robosuite/Lift`), in .robot/: robosuite 1.5.2
# with the Panda arm's assets only (its wheel, 157 MB, is over what a device call carries), MuJoCo 3.3.7, the other
# wheels the trainer needs beside the GPU image's (which has torch, numpy, numba, scipy, opencv, pillow, absl-py, etils,
# h5py, pyyaml, psutil, tensorboard), and the GL loaders (libEGL, libGL) MuJoCo's EGL renderer opens.
# With `mesa` it stages, in .mesa/, Mesa's EGL and its software renderer (llvmpipe) from this machine, for drawing the
# camera on the CPU where a GPU box would draw it on its GPU (`GL=mesa` in offline_study.sh). At 45 MB it travels in
# a device call of its own, after one that carried .robot/ (whose robosuite the camera study needs; the machine must
# stay warm between the two).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-3.12}"
platforms=()
for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 \
         manylinux1; do platforms+=(--platform "${p}_x86_64"); done
download() {  # DIR PACKAGE...: wheels for the offline machine's Python
    local dir="$1"; shift
    for pkg in "$@"; do
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
            "${platforms[@]}" -d "$dir" "$pkg"
    done
}
exclude() {  # FOLDER...: kept out of git
    for d in "$@"; do grep -qxF "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
}
libgl="libgl1 libglx0 libglvnd0 libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0"  # libGL and the X11 ones it links
mkdir -p .git/info
if [ "${2:-}" = mesa ]; then  # Mesa's EGL and software driver from this machine, with every library they link
    exclude .mesa
    lib=/usr/lib/x86_64-linux-gnu
    rm -rf .mesa /tmp/mesa_stage && mkdir -p .mesa /tmp/mesa_stage/lib/dri
    cp -L "$lib/libEGL_mesa.so.0" /tmp/mesa_stage/lib/
    cp -L "$lib/dri/swrast_dri.so" /tmp/mesa_stage/lib/dri/
    links=$(ldd "$lib/libEGL_mesa.so.0" "$lib/dri/swrast_dri.so") || true  # its own message below
    if [[ "$links" == *"not found"* ]]; then
        echo "offline_stage: Mesa lacks libraries here:" >&2; echo "$links" >&2; exit 1
    fi
    for f in $(awk '/=> \//{print $3}' <<< "$links" | sort -u); do
        case "$(basename "$f")" in  # not the C and C++ runtimes: the machine's own are newer
            libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libstdc++.so*|libgcc_s.so*) ;;
            *) cp -L "$f" /tmp/mesa_stage/lib/ ;;
        esac
    done
    tar -C /tmp/mesa_stage -cJf .mesa/mesa.tar.xz lib
    du -sh .mesa
    exit 0
fi
if [ "${2:-}" = robot ]; then
    exclude .robot
    rm -rf .robot /tmp/robot_stage && mkdir -p .robot/whl .robot/deb /tmp/robot_stage
    download .robot/whl mujoco==3.3.7 pyopengl glfw termcolor gymnasium==1.4.0 farama-notifications setproctitle
    download /tmp/robot_stage robosuite==1.5.2
    (cd /tmp/robot_stage && python3 -m zipfile -e robosuite-*.whl site)
    assets=/tmp/robot_stage/site/robosuite/models/assets  # keep the Panda, its gripper and mount, the arenas
    rm -rf "$assets/bullet_data"
    for d in "$assets"/robots/* "$assets"/grippers/meshes/* "$assets"/bases/meshes/*; do
        case "$(basename "$d")" in panda|panda_gripper|rethink_mount) ;; *) rm -rf "$d" ;; esac
    done
    tar -C /tmp/robot_stage/site -cJf .robot/robosuite.tar.xz .
    (cd .robot/deb && apt-get download $libgl libegl1 libopengl0 libgles2)  # and the loaders MuJoCo's EGL opens
    du -sh .robot
    exit 0
fi
mkdir -p .whl .gl
exclude .whl .gl
# procgen and its gym3 front end; gymnasium; setproctitle. torch, numpy, pyyaml, matplotlib, psutil, tensorboard and
# imageio are expected on the machine already (they are in the usual GPU images).
download .whl procgen-mirror==0.10.7 gym3==0.3.3 gym-notices gymnasium==1.4.0 farama-notifications cffi pycparser \
    glfw moderngl glcontext setproctitle
python3 -m pip wheel -q --no-deps -w .whl gym==0.26.2  # gym has no wheel on PyPI; it is pure Python
# procgen's wheel (48 MB) beside the tree is over a call's 64 MiB: the backgrounds starpilot never draws are blanked,
# so these wheels run starpilot alone (the package says so in procgen/SLIM_GAME; offline_study.sh refuses
# another game with it).
python3 scripts/slim_procgen_wheel.py .whl/procgen_mirror-*.whl starpilot
(cd .gl && apt-get download $libgl libpcre2-8-0 \
    && { apt-get download libglib2.0-0t64 2>/dev/null || apt-get download libglib2.0-0; })  # t64: Debian 13, Ubuntu 24.04
du -sh .whl .gl
