# SPDX-License-Identifier: MIT
# Sourced on the GPU machine from the project root, instead of .gpu/env.sh:
# that one, plus what the extra packages (fetch-extra-debs.sh) need there.
source .gpu/env.sh
# libmicrohttpd.pc names gnutls as a private requirement; kvpool links it
# dynamically and the machine has the library, not its .pc.
sed -i '/^Requires.private: gnutls/d' "$PKG_CONFIG_PATH"/libmicrohttpd.pc
