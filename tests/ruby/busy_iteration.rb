# Prints what Sidekiq 8.1's Busy page shows of the running iterable job
# whose jid is given: its Sidekiq::WorkSet entry, the iteration state the
# page reads for it (Sidekiq::IterableJobQuery, as the /busy route does;
# JobRecord#iterable_state, as a job's page does), and the line GET /busy
# renders under the job's "Started" time, and the process's queues there.
#
#   ruby busy_iteration.rb JID
#   work queue=Q class=C jid=J
#   state exec=N cursor=INSPECT rt=F
#   page <small>cursor=...; exec=N; rt=<span data-nwp="3">F</span>s</small>
#   queues Q1, Q2
#
#   ruby busy_iteration.rb --retries JID   (a failed one, on the Retries page)
#   state exec=N cursor=INSPECT rt=F
#   page <small>cursor=...; exec=N; rt=<span data-nwp="3">F</span>s</small>
require 'sidekiq/api'
require_relative 'web_mock'

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
web = sidekiq_web

def state_line(s, own)
  abort('busy_iteration.rb: no iteration state') unless s
  abort("busy_iteration.rb: JobRecord#iterable_state #{own&.raw.inspect} != #{s.raw.inspect}") unless own && own.raw == s.raw
  puts "state exec=#{s.executions} cursor=#{s.cursor.inspect} rt=#{s.runtime}"
end

def page(web, path)
  res = web.get(path)
  abort("busy_iteration.rb: GET #{path} #{res.status}") unless res.status == 200
  line = res.body.lines.find { |l| l.include?('cursor=') }
  puts "page #{line ? line.strip : '(no iteration line)'}"
  res.body
end

if ARGV[0] == '--retries'
  jid = ARGV.fetch(1)
  entry = Sidekiq::RetrySet.new.find_job(jid)
  abort("busy_iteration.rb: #{jid} is not in the RetrySet") unless entry
  state_line(Sidekiq::IterableJobQuery.new([jid])[jid], entry.iterable_state)
  page(web, '/retries')
  exit
end
jid = ARGV.fetch(0)
work = Sidekiq::WorkSet.new.find_work(jid)
abort("busy_iteration.rb: #{jid} is not in the WorkSet") unless work
puts "work queue=#{work.queue} class=#{work.job.klass} jid=#{work.job.jid}"
# As the /busy route reads them: the states of every job in the WorkSet.
states = Sidekiq::IterableJobQuery.new(Sidekiq::WorkSet.new.map { |_, _, w| w.job.jid })
state_line(states[jid], work.job.iterable_state)
body = page(web, '/busy')
# The process's queues, the line after "Queues: " (from its "capsules").
q = body.lines.each_cons(2).find { |a, _| a.include?('Queues') && a.include?('<b>') }
puts "queues #{q ? q[1].strip : '(no queues line)'}"
