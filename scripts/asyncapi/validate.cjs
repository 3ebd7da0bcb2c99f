// Validates AsyncAPI documents with the AsyncAPI project's own parser
// (@asyncapi/parser, installed by scripts/asyncapi/install.sh; NODE_PATH names it).
//
//   node scripts/asyncapi/validate.cjs FILE...
//
// Prints every diagnostic as `FILE: severity code path message` (severity 0 error,
// 1 warning, 2 info, 3 hint) and exits 1 when any file has an error or a warning.
const fs = require('fs');
const { Parser } = require('@asyncapi/parser');

const names = ['error', 'warning', 'info', 'hint'];

async function main() {
  const parser = new Parser();
  let failed = false;
  for (const file of process.argv.slice(2)) {
    const { document, diagnostics } = await parser.parse(fs.readFileSync(file, 'utf8'));
    for (const d of diagnostics) {
      console.log(`${file}: ${names[d.severity]} ${d.code} ${d.path.join('/')} ${d.message}`);
      if (d.severity <= 1) failed = true;
    }
    if (!document) failed = true;
    console.log(`${file}: ${document ? 'parsed' : 'NOT PARSED'}`);
  }
  process.exit(failed ? 1 : 0);
}

main().catch((e) => { console.error(e); process.exit(2); });
