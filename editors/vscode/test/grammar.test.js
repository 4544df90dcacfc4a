'use strict';
// The TextMate grammar (syntaxes/card.tmLanguage.json) as VS Code runs it: vscode-textmate on
// the Oniguruma regex engine. Every card in the repository tokenizes line by line; the
// sample cards' headers, arrows, calls and comments get the scopes a theme colours.
// Run from editors/vscode: npm ci && node --test

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test, before } = require('node:test');
const oniguruma = require('vscode-oniguruma');
const textmate = require('vscode-textmate');

const EXTENSION = path.resolve(__dirname, '..');
const ROOT = path.resolve(EXTENSION, '..', '..');
const GRAMMAR = path.join(EXTENSION, 'syntaxes', 'card.tmLanguage.json');
const SKIPPED_FOLDERS = new Set(['.git', '.venv', 'node_modules']);

let grammar;

async function loadGrammar() {
  const wasm = fs.readFileSync(path.join(path.dirname(require.resolve('vscode-oniguruma')),
    'onig.wasm'));
  await oniguruma.loadWASM(wasm.buffer.slice(wasm.byteOffset, wasm.byteOffset + wasm.length));
  const registry = new textmate.Registry({
    onigLib: Promise.resolve({
      createOnigScanner: (patterns) => new oniguruma.OnigScanner(patterns),
      createOnigString: (text) => new oniguruma.OnigString(text),
    }),
    loadGrammar: async (scopeName) => (scopeName === 'source.card'
      ? textmate.parseRawGrammar(fs.readFileSync(GRAMMAR, 'utf8'), GRAMMAR)
      : null),
  });
  return registry.loadGrammar('source.card');
}

/** Each line of `text` with its tokens, the grammar's state carried from line to line. */
function tokenize(text) {
  let state = textmate.INITIAL;
  return text.split(/\r?\n/).map((line) => {
    const result = grammar.tokenizeLine(line, state);
    state = result.ruleStack;
    return { line, tokens: result.tokens, stoppedEarly: result.stoppedEarly };
  });
}

/** The scopes of each token the `nth` occurrence of `piece` on line `number` spans. */
function scopesOver(lines, number, piece, nth = 0) {
  const { line, tokens } = lines[number - 1];
  let at = -1;
  for (let i = 0; i <= nth; i += 1) {
    at = line.indexOf(piece, at + 1);
    assert.notEqual(at, -1, `no ${JSON.stringify(piece)} on line ${number}: ${line}`);
  }
  return tokens.filter((t) => t.startIndex < at + piece.length && at < t.endIndex)
    .map((t) => t.scopes);
}

function assertScope(lines, number, piece, scope, nth = 0) {
  for (const scopes of scopesOver(lines, number, piece, nth)) {
    assert.ok(scopes.includes(scope),
      `${JSON.stringify(piece)} on line ${number} has ${scopes.join(' ')}, not ${scope}`);
  }
}

function cardsUnder(folder) {
  const found = [];
  for (const entry of fs.readdirSync(folder, { withFileTypes: true })) {
    const where = path.join(folder, entry.name);
    if (entry.isDirectory() && !SKIPPED_FOLDERS.has(entry.name)) {
      found.push(...cardsUnder(where));
    } else if (entry.isFile() && entry.name.endsWith('.card')) {
      found.push(where);
    }
  }
  return found.sort();
}

function read(relative) {
  return tokenize(fs.readFileSync(path.join(ROOT, relative), 'utf8'));
}

before(async () => {
  grammar = await loadGrammar();
  assert.ok(grammar, 'the grammar source.card did not load');
});

test('every card tokenizes, each line covered by its tokens', () => {
  const cards = cardsUnder(ROOT);
  assert.ok(cards.some((card) => card.endsWith(path.join('cards', 'gpt2.card'))));
  for (const card of cards) {
    const relative = path.relative(ROOT, card);
    // tests/golden keeps cards written wrong on purpose: they tokenize, with illegal marks
    const broken = relative.startsWith(path.join('tests', 'golden'));
    tokenize(fs.readFileSync(card, 'utf8')).forEach(({ line, tokens, stoppedEarly }, i) => {
      const where = `${relative}:${i + 1}`;
      assert.equal(stoppedEarly, false, `${where} stopped early`);
      assert.equal(tokens[0].startIndex, 0, where);
      tokens.forEach((t, k) => k && assert.equal(t.startIndex, tokens[k - 1].endIndex, where));
      assert.ok(tokens.at(-1).endIndex >= line.length, `${where} is not covered`);
      const illegal = tokens.filter((t) => t.scopes.some((s) => s.startsWith('invalid.')));
      if (!broken) {
        assert.deepEqual(illegal.map((t) => line.slice(t.startIndex, t.endIndex)), [], where);
      }
    });
  }
});

test('gpt2.card: headers, arrows, calls, declarations and comments', () => {
  const lines = read(path.join('cards', 'gpt2.card'));
  assertScope(lines, 1, 'Algorithm', 'keyword.other.header.card');
  assertScope(lines, 1, '←', 'keyword.operator.assignment.card');
  assertScope(lines, 1, 'GPT2', 'entity.name.function.card');
  assertScope(lines, 1, 'θ', 'variable.other.property.card');
  assertScope(lines, 2, '/* GPT-2', 'comment.block.card');
  assertScope(lines, 3, 'Input', 'keyword.other.header.card');
  assertScope(lines, 3, 'x', 'variable.parameter.card');
  assertScope(lines, 3, 'token IDs.', 'meta.prose.card');
  assertScope(lines, 5, 'D_f', 'variable.other.constant.card');
  assertScope(lines, 5, 'ℕ', 'storage.type.card');
  assertScope(lines, 5, '1e-5', 'constant.numeric.float.card');
  assertScope(lines, 6, 'includes all of the following parameters:', 'keyword.other.bundle.card');
  assertScope(lines, 7, 'W_e', 'variable.other.property.card');
  assertScope(lines, 7, 'ℝ', 'storage.type.card');
  assertScope(lines, 7, '×', 'keyword.operator.card');
  assertScope(lines, 7, 'token embeddings', 'meta.prose.card');
  assertScope(lines, 12, 'Preset', 'keyword.other.header.card');
  assertScope(lines, 12, 'gpt2', 'entity.name.type.preset.card');
  assertScope(lines, 12, 'V', 'variable.other.constant.card');
  assertScope(lines, 12, '▷ GPT-2 small', 'comment.line.card');
  assertScope(lines, 14, '1', 'entity.name.label.step.card');
  assertScope(lines, 15, 'for', 'keyword.control.card');
  assertScope(lines, 15, 'do', 'keyword.control.card');
  assertScope(lines, 16, 'GPT2Block', 'entity.name.function.card');
  assertScope(lines, 16, '▷ E ∈ ℝ^{T×D}', 'comment.line.card');
  assertScope(lines, 17, 'end', 'keyword.control.card');
  assertScope(lines, 18, 'LayerNorm', 'entity.name.function.card');
  assertScope(lines, 19, 'return', 'keyword.control.card');
  assertScope(lines, 19, '^⊺', 'keyword.operator.transpose.card');
});

test('layer_norm.card: sums, roots and the element-wise product', () => {
  const lines = read(path.join('cards', 'nn', 'layer_norm.card'));
  assertScope(lines, 1, 'LayerNorm', 'entity.name.function.card');
  assertScope(lines, 5, 'ε', 'variable.other.constant.card');
  assertScope(lines, 6, 'γ', 'variable.other.property.card');
  assertScope(lines, 7, 'β', 'variable.other.property.card');
  assertScope(lines, 8, 'Σ', 'keyword.operator.card');
  assertScope(lines, 10, '√', 'keyword.operator.card');
  assertScope(lines, 10, '⊙', 'keyword.operator.card');
});

test('lm_training.card: builtins, roles and a training loop', () => {
  const lines = read(path.join('cards', 'recipes', 'lm_training.card'));
  assertScope(lines, 3, 'x_n', 'variable.parameter.card');
  assertScope(lines, 16, 'seed of every random draw', 'keyword.other.role.card');
  assertScope(lines, 17, 'φ', 'variable.other.constant.card');
  assertScope(lines, 17, 'number format of', 'keyword.other.role.card');
  assertScope(lines, 21, 'min', 'support.function.builtin.card', 2);  // after η_min twice
  assertScope(lines, 22, 'softmax', 'support.function.builtin.card');
  assertScope(lines, 23, '∇', 'keyword.operator.card');
  assertScope(lines, 25, 'AdamW', 'support.function.builtin.card');
});

test('ASCII spellings get the scopes of their symbols', () => {
  const lines = read(path.join('tests', 'golden', 'ascii_spellings.card'));
  assertScope(lines, 1, '<-', 'keyword.operator.assignment.card');
  assertScope(lines, 1, 'Affine', 'entity.name.function.card');
  assertScope(lines, 3, 'in', 'keyword.operator.word.card');
  assertScope(lines, 3, 'R', 'storage.type.card');
  assertScope(lines, 3, 'x', 'keyword.operator.card');
  assertScope(lines, 10, 'for', 'keyword.control.card');
  assertScope(lines, 13, '#', 'invalid.illegal.character.card');
});
