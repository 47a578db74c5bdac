# Prints what Sidekiq's own Metrics API (the Web UI's Metrics tab) reads
# for each class named on the command line, over the last 10 minutes:
#   CLASS p=N f=N ms=N hist=N   (hist: jobs in the histogram buckets)
# Runs under Sidekiq 7.x or 8.x (tests/ruby/sidekiq_version.rb loads it).
require 'sidekiq/api'
require 'sidekiq/metrics/query'

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
q = Sidekiq::Metrics::Query.new
ARGV.each do |klass|
  r = q.for_job(klass, minutes: 10).job_results[klass]
  hist = r.hist.values.flatten.sum
  puts "#{klass} p=#{r.totals['p']} f=#{r.totals['f']} ms=#{r.totals['ms']} hist=#{hist}"
end
top = q.top_jobs(minutes: 10).job_results
puts "top #{top.keys.sort.join(',')}"
# Sidekiq 8's 24h to 72h periods read the 10-minute rollups instead:
#   CLASS 24h p=N f=N ms=N
if Gem::Version.new(Sidekiq::VERSION) >= Gem::Version.new('8.0')
  ARGV.each do |klass|
    t = q.for_job(klass, hours: 24).job_results[klass].totals
    puts "#{klass} 24h p=#{t['p']} f=#{t['f']} ms=#{t['ms']}"
  end
  puts "top 24h #{q.top_jobs(hours: 24).job_results.keys.sort.join(',')}"
end
