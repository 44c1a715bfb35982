#!/usr/bin/env bash
# On the GPU machine: park one part of a split wheel set (made by `make .device-ray`); with the last part, join,
# verify, unpack and pip-install REQUIREMENT from those wheels alone (into the machine's own environment, so the
# packages its image already has are kept).   bash scripts/stage_wheels.sh .device-ray/pK
set -euo pipefail
P=${1:?usage: stage_wheels.sh DIR/pK}
read -r SUM NAME N REQ < "$P/wheels.info"
D=/tmp/nimble-device/${NAME%.tar}
mkdir -p "$D"
cp "$P"/part0* "$D/"
have=$(ls "$D"/part0* | wc -l)
if [ "$have" -lt "$N" ]; then echo "$NAME: $have of $N parts parked in $D"; exit 0; fi
cat $(ls "$D"/part0* | sort) > "$D/$NAME"
echo "$SUM  $D/$NAME" | sha256sum -c --quiet
tar -xf "$D/$NAME" -C "$D"
python3 -m pip install -q --no-index --find-links "$D/wheels" "$REQ"
echo "$REQ installed from $NAME"
