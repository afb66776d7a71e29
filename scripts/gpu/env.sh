# SPDX-License-Identifier: MIT
# Sourced on the GPU machine from the project root, instead of .gpu/env.sh:
# that one, plus what the extra packages (fetch-extra-debs.sh) need there.
source .gpu/env.sh
# libmicrohttpd.pc names gnutls as a private requirement; kvpool links it
# dynamically and the machine has the library, not its .pc.
sed -i '/^Requires.private: gnutls/d' "$PKG_CONFIG_PATH"/libmicrohttpd.pc
# How the GPU scripts configure kvpool there.
KVPOOL_GPU_CMAKE_FLAGS="-DKVPOOL_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DKVPOOL_WERROR=${KVPOOL_GPU_WERROR:-ON} -DPython3_EXECUTABLE=/opt/torch/.venv/bin/python3"
# redis-server and redis-cli from the carried packages (kvbench remote).
export PATH=$PATH:/tmp/deps/usr/bin
