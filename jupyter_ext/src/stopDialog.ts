/**
 * Stop's one question, the same wherever Stop is pressed (the run's dashboard, the sidebar's runs
 * list): what it will do (it stops every rank), Cancel or the button that does it.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';

import { IStopQuestion } from './dashboardModel';

/** Ask once; true when the person pressed the button that stops. */
export async function askToStop(question: IStopQuestion): Promise<boolean> {
  const answer = await showDialog({
    title: question.title,
    body: question.body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: question.accept })]
  });
  return answer.button.accept;
}
