"""Apache Avro (Python) side of the interop test, run by Debian's /usr/bin/python3.

  avro_interop.py decode SCHEMA_FILE HEX   -> the datum as JSON (logical types rendered)
  avro_interop.py encode SCHEMA_FILE       -> hex of the schemaless binary of a fixed datum
  avro_interop.py canonical SCHEMA_FILE    -> the schema's Parsing Canonical Form
"""
import datetime
import decimal
import io
import json
import sys
import uuid

import avro.io
import avro.schema


def render(v):
    if isinstance(v, datetime.datetime):
        epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
        return {"epoch_ms": (v - epoch) // datetime.timedelta(milliseconds=1)}
    if isinstance(v, decimal.Decimal):
        return {"decimal": str(v)}
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, dict):
        return {k: render(x) for k, x in v.items()}
    if isinstance(v, list):
        return [render(x) for x in v]
    return v


def main():
    mode, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        schema = avro.schema.parse(f.read())
    if mode == "canonical":
        print(schema.canonical_form)
    elif mode == "decode":
        body = bytes.fromhex(sys.argv[3])
        datum = avro.io.DatumReader(schema).read(avro.io.BinaryDecoder(io.BytesIO(body)))
        print(json.dumps(render(datum), sort_keys=True))
    elif mode == "encode":
        datum = {
            "id": "018f0f18-17aa-7000-8000-00000000beef",
            "placed_at": datetime.datetime(2026, 11, 29, 7, 30, 15, 123000, tzinfo=datetime.timezone.utc),
            "total": decimal.Decimal("-4711.05"),
            "status": "SHIPPED",
            "lines": [{"sku": "py-1", "qty": 7}, {"sku": "py-2", "qty": -1}],
            "tags": {"lang": "python", "empty": ""},
            "note": "from python é",
            "discount": 0.25,
            "paid": False,
            "weight": 0.5,
        }
        out = io.BytesIO()
        avro.io.DatumWriter(schema).write(datum, avro.io.BinaryEncoder(out))
        print(out.getvalue().hex())
    else:
        sys.exit("unknown mode " + mode)


main()
