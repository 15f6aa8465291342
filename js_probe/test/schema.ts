// The beacon contract, read from the same file the collector validates with.
import { readFileSync } from "node:fs";
import Ajv2020Module from "ajv/dist/2020.js";

// ajv is CommonJS: under node ESM its default export is the module object.
const Ajv2020 = ((Ajv2020Module as unknown as { default?: typeof Ajv2020Module }).default ?? Ajv2020Module);

const schema = JSON.parse(
  readFileSync(new URL("../../../docs/contracts/beacon.v2.schema.json", import.meta.url), "utf8"),
) as object;
const ajv = new Ajv2020({ allErrors: true, strict: false });
const validate = ajv.compile(schema);

/** Violations of beacon v2 (what the probe sends) as "path: message" lines; empty when valid. */
export function beaconErrors(doc: unknown): string[] {
  return validate(doc) ? [] : (validate.errors ?? []).map((e) => `${e.instancePath || "(root)"}: ${e.message}`);
}
