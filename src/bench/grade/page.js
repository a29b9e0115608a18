// The grading page: one unit at a time from /api/next, its answers scored 1–5 under their
// labels, the scores posted to /api/grade, whose answer (only then) names the servers.
// Every text from the run is set with textContent: answers are never markup.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const SCORE_KEYS = ['1', '2', '3', '4', '5'];

  /** The unit shown (as /api/next sent it), the scores given so far per label, and the phase:
   *  loading, grading, submitting, revealed or done. */
  const state = { unit: null, scores: {}, phase: 'loading' };

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function showError(message) {
    $('error').textContent = message;
    $('error').hidden = !message;
  }

  function showProgress(progress) {
    $('progress').textContent = `${progress.graded} of ${progress.total} graded`;
  }

  /** A message's content as text: its string, or its parts (media stand-ins named). */
  function contentText(content) {
    if (content === null || content === undefined) return '';
    if (typeof content === 'string') return content;
    if (!Array.isArray(content)) return JSON.stringify(content);
    return content.map((part) => {
      switch (part.type) {
        case 'text': return part.text;
        case 'bench_clip': return `[spoken clip ${part.clip}]`;
        case 'bench_picture': return `[picture ${part.picture}]`;
        case 'image_url': return '[an image]';
        case 'input_audio': return '[a clip]';
        default: return `[${part.type}]`;
      }
    }).join('\n');
  }

  function renderConversation(messages) {
    const box = $('conversation');
    box.replaceChildren();
    for (const message of messages) {
      const role = String(message.role || 'message');
      const node = element('div', `msg ${role}`);
      node.append(element('span', 'role', role === 'tool' ? 'tool result' : role));
      const text = contentText(message.content);
      if (text) node.append(document.createTextNode(text));
      for (const call of message.tool_calls || []) {
        const fn = call.function || {};
        node.append(element('div', 'call', `→ ${fn.name}(${fn.arguments})`));
      }
      box.append(node);
    }
  }

  function renderChoice(choice) {
    const card = element('article', 'choice');
    card.id = `choice-${choice.label}`;
    card.tabIndex = 0;
    card.dataset.label = choice.label;
    card.setAttribute('aria-label', `Answer ${choice.label}`);
    const head = element('div', 'choice-head');
    head.append(element('span', 'label', choice.label));
    const scale = element('fieldset', 'scale');
    scale.setAttribute('aria-label', `Score of answer ${choice.label}`);
    for (const key of SCORE_KEYS) {
      const option = element('label');
      const radio = element('input');
      radio.type = 'radio';
      radio.name = `score-${choice.label}`;
      radio.value = key;
      // The card is the keyboard's stop; its digits score it (see onKey).
      radio.tabIndex = -1;
      radio.addEventListener('change', () => setScore(choice.label, Number(key)));
      option.append(radio, element('span', '', key));
      scale.append(option);
    }
    head.append(scale);
    card.append(head, element('p', 'text', choice.text));
    const writtenBy = element('p', 'written-by');
    writtenBy.hidden = true;
    card.append(writtenBy);
    return card;
  }

  function render(unit) {
    state.unit = unit;
    state.scores = {};
    $('item-id').textContent = unit.sample ? `${unit.item} (sample ${unit.sample})` : unit.item;
    renderConversation(unit.messages);
    $('tools').hidden = unit.tools.length === 0;
    $('tools').textContent = `Tools offered: ${unit.tools.join(', ')}`;
    $('reference-box').hidden = !unit.reference;
    $('reference').textContent = unit.reference || '';
    $('rubric-notes').textContent = unit.rubric || '';
    $('choices').replaceChildren(...unit.choices.map(renderChoice));
    $('tie').checked = false;
    $('tie').disabled = false;
    $('reveal').hidden = true;
    $('reveal-list').replaceChildren();
    $('unit').hidden = false;
    $('done').hidden = true;
    refreshScores();
    state.phase = 'grading';
    cards()[0].focus();
  }

  function cards() {
    return [...document.querySelectorAll('#choices .choice')];
  }

  function labels() {
    return state.unit ? state.unit.choices.map((c) => c.label) : [];
  }

  function allScored() {
    return labels().every((label) => state.scores[label] !== undefined);
  }

  function refreshScores() {
    for (const card of cards()) {
      const score = state.scores[card.dataset.label];
      card.classList.toggle('scored', score !== undefined);
      for (const radio of card.querySelectorAll('input[type=radio]')) {
        radio.checked = Number(radio.value) === score;
      }
    }
    $('submit').disabled = state.phase !== 'grading' || !allScored();
  }

  /** Scores one answer, or every answer under a tie. */
  function setScore(label, score) {
    if (state.phase !== 'grading') return;
    const targets = $('tie').checked ? labels() : [label];
    for (const target of targets) state.scores[target] = score;
    showError('');
    refreshScores();
  }

  function toggleTie() {
    const tie = $('tie');
    tie.checked = !tie.checked;
    onTieChanged();
  }

  /** Under a tie every answer takes one score: the current answer's, or the first given. */
  function onTieChanged() {
    if (!$('tie').checked) return;
    const current = focusedLabel();
    const given = state.scores[current] ?? Object.values(state.scores)[0];
    if (given !== undefined) setScore(labels()[0], given);
  }

  /** The label of the answer that has the focus, if one has. */
  function focusedLabel() {
    const card = document.activeElement && document.activeElement.closest('.choice');
    return card ? card.dataset.label : undefined;
  }

  /** The answer a digit scores: the focused one, else the first without a score. */
  function currentLabel() {
    return focusedLabel() ?? labels().find((label) => state.scores[label] === undefined);
  }

  /** After scoring `label`: the next answer, else the first one left without a score, else
   *  Submit (at once under a tie: one score covers every answer). */
  function moveOnFrom(label) {
    const all = labels();
    const next = $('tie').checked ? undefined : (all[all.indexOf(label) + 1] ?? all.find((l) => state.scores[l] === undefined));
    if (next !== undefined) $(`choice-${next}`).focus();
    else $('submit').focus();
  }

  function moveBy(step) {
    const all = cards();
    const index = all.indexOf(document.activeElement && document.activeElement.closest('.choice'));
    const target = index < 0 ? (step > 0 ? 0 : all.length - 1) : Math.min(Math.max(index + step, 0), all.length - 1);
    all[target].focus();
  }

  async function submit() {
    if (state.phase !== 'grading') return;
    if (!allScored()) {
      showError('Score every answer first (keys 1 to 5).');
      return;
    }
    const unit = state.unit;
    state.phase = 'submitting';
    refreshScores();
    const body = { item: unit.item, sample: unit.sample, scores: state.scores, tie: $('tie').checked };
    try {
      const response = await fetch('/api/grade', {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
      });
      const answer = await response.json();
      if (response.status === 409) {
        showError(`${answer.error.message}: showing the next item.`);
        await loadNext(true);
        return;
      }
      if (!response.ok) throw new Error(answer.error ? answer.error.message : `HTTP ${response.status}`);
      reveal(answer);
    } catch (error) {
      state.phase = 'grading';
      refreshScores();
      showError(`The scores were not saved: ${error.message}`);
    }
  }

  function reveal(answer) {
    state.phase = 'revealed';
    showError('');
    showProgress(answer.progress);
    const list = $('reveal-list');
    list.replaceChildren();
    for (const card of cards()) {
      const label = card.dataset.label;
      const servers = (answer.reveal[label] || []).join(', ');
      const writtenBy = card.querySelector('.written-by');
      writtenBy.textContent = `written by ${servers}`;
      writtenBy.hidden = false;
      for (const radio of card.querySelectorAll('input')) radio.disabled = true;
      list.append(element('li', '', `${label} (scored ${state.scores[label]}): ${servers}`));
    }
    $('tie').disabled = true;
    $('submit').disabled = true;
    $('reveal').hidden = false;
    $('next').focus();
  }

  async function loadNext(keepError) {
    state.phase = 'loading';
    if (!keepError) showError('');
    try {
      const response = await fetch('/api/next');
      const answer = await response.json();
      if (!response.ok) throw new Error(answer.error ? answer.error.message : `HTTP ${response.status}`);
      showProgress(answer.progress);
      if (answer.unit) {
        render(answer.unit);
      } else {
        state.phase = 'done';
        state.unit = null;
        $('unit').hidden = true;
        $('done').hidden = false;
      }
    } catch (error) {
      showError(`Cannot load the next item: ${error.message}`);
    }
  }

  function onKey(event) {
    if (event.ctrlKey || event.altKey || event.metaKey) return;
    if (state.phase === 'revealed') {
      if (event.key === 'Enter' || event.key === 'n') {
        event.preventDefault();
        loadNext(false);
      }
      return;
    }
    if (state.phase !== 'grading') return;
    if (SCORE_KEYS.includes(event.key)) {
      event.preventDefault();
      const label = $('tie').checked ? (currentLabel() ?? labels()[0]) : currentLabel();
      if (label === undefined) return;
      setScore(label, Number(event.key));
      moveOnFrom(label);
    } else if (['ArrowDown', 'ArrowRight', 'j'].includes(event.key)) {
      event.preventDefault();
      moveBy(1);
    } else if (['ArrowUp', 'ArrowLeft', 'k'].includes(event.key)) {
      event.preventDefault();
      moveBy(-1);
    } else if (event.key === 't') {
      event.preventDefault();
      toggleTie();
    } else if (event.key === 'Enter') {
      // Also on a focused button: one submit, not a keydown and a click.
      event.preventDefault();
      submit();
    }
  }

  document.addEventListener('keydown', onKey);
  $('tie').addEventListener('change', onTieChanged);
  $('submit').addEventListener('click', submit);
  $('next').addEventListener('click', () => loadNext(false));
  loadNext(false);
})();
